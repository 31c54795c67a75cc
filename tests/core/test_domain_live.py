"""The pure rules of the live layer (connections, idle, news, WebSocket frames): fast, no
Redis, no database.

Cases: tests/core/domain_cases.py.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from django.utils import translation

from presence import domain
from presence.domain import (
    Choices,
    Device,
    InvalidInput,
    LiveState,
    Presence,
    Relation,
    Status,
    Timing,
    Visibility,
)
from tests.core.domain_cases import (
    BLOCKED_CONTACT,
    CLOSE,
    CONTACT,
    LIMITS,
    NOW,
    STRANGER,
    everyone,
    online,
)

# --- the live layer: connections, idle, news, WebSocket frames ------------------------------

LIVE_TIMING = Timing(online_window=300, offline_grace=5, connection_ttl=90)
#: small limits, so that the frame size and subscription bounds are easy to reach
FRAME_LIMITS = domain.Limits(
    text_max_length=10,
    emoji_max_length=4,
    max_expiry=3600,
    max_frame_bytes=1000,
    max_subscriptions=3,
)
#: ... and a frame limit that a small frame reaches
SMALL_FRAMES = replace(FRAME_LIMITS, max_frame_bytes=64)


def parse(data: object, limits: domain.Limits = FRAME_LIMITS) -> domain.ClientMessage:
    return domain.parse_frame(data if isinstance(data, str) else json.dumps(data), limits)


def refused(data: object, limits: domain.Limits = FRAME_LIMITS) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        parse(data, limits)
    return info.value


class TestParseFrame:
    @pytest.mark.parametrize(
        ("data", "message"),
        [
            ({"type": "heartbeat"}, domain.Heartbeat(domain.HeartbeatState.ACTIVE)),
            ({"type": "heartbeat", "state": "active"}, domain.Heartbeat()),
            ({"type": "heartbeat", "state": "idle"}, domain.Heartbeat(domain.HeartbeatState.IDLE)),
            # Members the protocol does not define are ignored.
            ({"type": "heartbeat", "extra": [1, 2]}, domain.Heartbeat()),
            ({"type": "subscribe", "users": [3, 1, 2]}, domain.Subscribe((3, 1, 2))),
            ({"type": "subscribe", "users": []}, domain.Subscribe(())),
            ({"type": "unsubscribe", "users": [7]}, domain.Unsubscribe((7,))),
            (
                {"type": "set_status", "status": "dnd", "text": " focus ", "expires_in": 60},
                domain.SetStatus(
                    domain.StatusChange(status=domain.StatusChoice.DND, text="focus", expires_in=60)
                ),
            ),
            (
                {"type": "set_status", "status": "invisible"},
                domain.SetStatus(domain.StatusChange(status=domain.StatusChoice.INVISIBLE)),
            ),
        ],
    )
    def test_each_message_type(self, data: dict[str, Any], message: object) -> None:
        assert parse(data) == message

    def test_duplicate_ids_are_removed_keeping_their_first_place(self) -> None:
        assert parse({"type": "subscribe", "users": [2, 1, 2, 3, 1]}) == domain.Subscribe((2, 1, 3))
        assert parse({"type": "unsubscribe", "users": [5, 5, 5, 5, 5]}) == domain.Unsubscribe((5,))

    def test_binary_frames_are_refused(self) -> None:
        with pytest.raises(InvalidInput) as info:
            domain.parse_frame(None, FRAME_LIMITS)
        assert info.value.code == "invalid_message"

    @pytest.mark.parametrize("text", ["", "{", "heartbeat", "{'type': 'heartbeat'}", '{"type":}'])
    def test_invalid_json(self, text: str) -> None:
        assert refused(text).code == "invalid_json"

    @pytest.mark.parametrize(
        "text",
        [
            "[" * 1000 + "]" * 1000,  # 2 KB: once a RecursionError that killed the consumer
            "{" + '"a":{' * 1000 + "}" * 1001,
            '{"type": "subscribe", "users": ' + "[" * 1000 + "]" * 1000 + "}",
            "[" * 30_000 + "]" * 30_000,  # within the default MAX_FRAME_BYTES
        ],
    )
    def test_valid_json_nested_too_deeply_is_refused(self, text: str) -> None:
        error = refused(text, replace(FRAME_LIMITS, max_frame_bytes=65536))
        assert (error.code, error.message) == (
            "invalid_message",
            "The frame nests arrays or objects too deeply.",
        )

    @pytest.mark.parametrize("text", ["[]", '[{"type": "heartbeat"}]', '"heartbeat"', "1", "null"])
    def test_json_that_is_not_an_object(self, text: str) -> None:
        assert refused(text).code == "invalid_message"

    @pytest.mark.parametrize(
        "data",
        [{}, {"type": None}, {"type": 1}, {"type": True}, {"type": ["heartbeat"]}, {"users": [1]}],
    )
    def test_type_missing_or_not_a_string(self, data: dict[str, Any]) -> None:
        assert refused(data).code == "invalid_message"

    @pytest.mark.parametrize("kind", ["ping", "Heartbeat", "", "presence_state", "subscribe "])
    def test_unknown_type(self, kind: str) -> None:
        error = refused({"type": kind})
        assert error.code == "unknown_type"
        with translation.override("en"):
            assert refused({"type": kind}).message == (
                f"Unknown message type {kind!r}: use one of heartbeat, subscribe, unsubscribe, "
                "set_status, join, leave, room_more, watch_count, unwatch_count, "
                "watch_room_count, unwatch_room_count."
            )

    @pytest.mark.parametrize(
        ("state", "code"), [("away", "invalid_value"), ("IDLE", "invalid_value")]
    )
    def test_heartbeat_state_of_no_such_value(self, state: str, code: str) -> None:
        assert refused({"type": "heartbeat", "state": state}).code == code

    @pytest.mark.parametrize("state", [None, 1, True, ["idle"], {"state": "idle"}])
    def test_heartbeat_state_of_the_wrong_type(self, state: object) -> None:
        assert refused({"type": "heartbeat", "state": state}).code == "invalid_message"

    @pytest.mark.parametrize("kind", ["subscribe", "unsubscribe"])
    @pytest.mark.parametrize(
        "users",
        [
            None,
            5,
            "1,2",
            {"1": 1},
            [True],
            [1, False],
            [1.0],
            [2.5],
            [None],
            [[1]],
        ],
    )
    def test_users_of_the_wrong_type(self, kind: str, users: object) -> None:
        assert refused({"type": kind, "users": users}).code == "invalid_message"

    @pytest.mark.parametrize("kind", ["subscribe", "unsubscribe"])
    def test_users_missing(self, kind: str) -> None:
        assert refused({"type": kind}).code == "invalid_message"

    @pytest.mark.parametrize("kind", ["subscribe", "unsubscribe"])
    @pytest.mark.parametrize("users", [[0], [-3], [1, 0], [2, -1, 3], [2**63]])
    def test_ids_must_be_positive_ids_a_database_can_hold(self, kind: str, users: object) -> None:
        error = refused({"type": kind, "users": users})
        assert error.code == "invalid_value"
        with translation.override("en"):
            assert error.message == "User ids are positive integers."

    @pytest.mark.parametrize("kind", ["subscribe", "unsubscribe"])
    def test_ids_may_be_strings_and_are_kept_as_sent(self, kind: str) -> None:
        # The site's pk decides what a string must look like (the consumer checks it); the
        # frame keeps each id as sent, so that answers can name it the same way.
        uid = "0b6f2c9e-3d4a-4f1e-9c2b-7a1d5e8f9a10"
        message = parse({"type": kind, "users": [7, "7", uid.upper(), "7"]})
        assert isinstance(message, domain.Subscribe | domain.Unsubscribe)
        assert message.users == (7, "7", uid.upper())

    @pytest.mark.parametrize("kind", ["subscribe", "unsubscribe"])
    @pytest.mark.parametrize("users", [[""], [1, ""], ["x" * 256]])
    def test_string_ids_must_be_short_and_not_empty(self, kind: str, users: object) -> None:
        error = refused({"type": kind, "users": users})
        assert error.code == "invalid_value"
        with translation.override("en"):
            assert error.message == ("A user id is a non-empty string of at most 255 characters.")

    def test_a_string_id_of_255_characters_is_an_id(self) -> None:
        assert parse({"type": "subscribe", "users": ["x" * 255]}) == domain.Subscribe(("x" * 255,))

    def test_the_largest_database_id_is_an_id(self) -> None:
        assert parse({"type": "subscribe", "users": [2**63 - 1]}) == domain.Subscribe((2**63 - 1,))

    @pytest.mark.parametrize("kind", ["subscribe", "unsubscribe"])
    def test_too_many_subscriptions_past_the_limit(self, kind: str) -> None:
        # At the limit (3), counting an id named twice once, is fine; one more is not.
        message = parse({"type": kind, "users": [1, 2, 3, 3, 1]})
        assert isinstance(message, domain.Subscribe | domain.Unsubscribe)
        assert message.users == (1, 2, 3)
        with translation.override("en"):
            error = refused({"type": kind, "users": [1, 2, 3, 4]})
        assert (error.code, error.message) == (
            "too_many_subscriptions",
            "4 user ids in one frame; at most 3.",
        )

    @pytest.mark.parametrize(
        ("data", "code"),
        [
            ({"type": "set_status"}, "invalid_message"),
            ({"type": "set_status", "status": 1}, "invalid_message"),
            ({"type": "set_status", "status": "busy"}, "invalid_value"),
            ({"type": "set_status", "status": "auto", "text": 5}, "invalid_message"),
            ({"type": "set_status", "status": "auto", "text": "x" * 11}, "invalid_value"),
            ({"type": "set_status", "status": "auto", "emoji": "🙂" * 5}, "invalid_value"),
            ({"type": "set_status", "status": "auto", "activity": "a\tb"}, "invalid_value"),
            ({"type": "set_status", "status": "auto", "expires_in": "60"}, "invalid_message"),
            ({"type": "set_status", "status": "auto", "expires_in": False}, "invalid_message"),
            ({"type": "set_status", "status": "auto", "expires_in": 0}, "invalid_value"),
            ({"type": "set_status", "status": "auto", "expires_in": 3601}, "invalid_value"),
        ],
    )
    def test_status_problems_of_set_status(self, data: dict[str, Any], code: str) -> None:
        assert refused(data).code == code

    def test_frame_size_is_measured_in_utf8_bytes(self) -> None:
        def frame(pad: str) -> str:
            return '{"type":"heartbeat","pad":"' + pad + '"}'

        at_limit = frame("é" * 17 + "a")  # 47 characters, 64 bytes
        assert (len(at_limit), len(at_limit.encode())) == (47, 64)
        assert parse(at_limit, SMALL_FRAMES) == domain.Heartbeat()
        over = frame("é" * 17 + "aa")  # 48 characters, 65 bytes
        with translation.override("en"):
            error = refused(over, SMALL_FRAMES)
        assert (error.code, error.message) == (
            "frame_too_large",
            "The frame is 65 bytes long; at most 64.",
        )
        # The same number of characters in ASCII is well within the limit.
        assert parse(frame("a" * 19), SMALL_FRAMES) == domain.Heartbeat()

    def test_size_is_checked_before_anything_else(self) -> None:
        assert refused("x" * 65, SMALL_FRAMES).code == "frame_too_large"  # not even JSON
        assert refused("x" * 64, SMALL_FRAMES).code == "invalid_json"

    def test_default_limits(self) -> None:
        assert (LIMITS.max_frame_bytes, LIMITS.max_subscriptions) == (65536, 1000)


class TestLiveStatusOfConnections:
    @pytest.mark.parametrize(("ago", "expected"), [(0, "online"), (90, "online"), (91, "offline")])
    def test_connected_user_is_online_for_the_connection_ttl(self, ago: int, expected: str) -> None:
        state = LiveState(last_active=NOW - ago, devices=(Device.WEB,), connected=True)
        assert domain.live_status(state, NOW, LIVE_TIMING) == expected

    def test_the_connection_ttl_replaces_the_online_window(self) -> None:
        # 100 s after the last heartbeat: within ONLINE_WINDOW, but the connection is gone.
        crashed = LiveState(last_active=NOW - 100, connected=True)
        assert domain.live_status(crashed, NOW, LIVE_TIMING) is Status.OFFLINE
        assert domain.live_status(LiveState(last_active=NOW - 100), NOW, LIVE_TIMING) is (
            Status.ONLINE
        )
        # ... and a TTL longer than the window keeps a connected user online past the window.
        long_ttl = Timing(online_window=300, offline_grace=5, connection_ttl=600)
        quiet = LiveState(last_active=NOW - 400, connected=True)
        assert domain.live_status(quiet, NOW, long_ttl) is Status.ONLINE

    @pytest.mark.parametrize(("ago", "expected"), [(0, "idle"), (90, "idle"), (91, "offline")])
    def test_idle_connections(self, ago: int, expected: str) -> None:
        state = LiveState(last_active=NOW - ago, connected=True, idle=True)
        assert domain.live_status(state, NOW, LIVE_TIMING) == expected

    @pytest.mark.parametrize(
        ("ago", "idle", "expected"),
        [(0, True, "idle"), (5, True, "idle"), (6, True, "offline"), (5, False, "online")],
    )
    def test_signed_off_keeps_idle_within_the_grace(
        self, ago: int, idle: bool, expected: str
    ) -> None:
        state = LiveState(last_active=NOW - ago, signed_off=True, idle=idle)
        assert domain.live_status(state, NOW, LIVE_TIMING) == expected


class TestOfflineAt:
    @pytest.mark.parametrize(
        ("state", "expected"),
        [
            (LiveState(), None),
            (LiveState(last_active=NOW), NOW + 300),
            # The TTL and the grace count from the end of the recorded second (+ 1 s); page
            # views' window from its start.
            (LiveState(last_active=NOW, connected=True), NOW + 91),
            (LiveState(last_active=NOW, connected=True, idle=True), NOW + 91),
            (LiveState(last_active=NOW, signed_off=True), NOW + 6),
            # Signed off wins over a connected flag (decode_score never makes both).
            (LiveState(last_active=NOW, signed_off=True, connected=True), NOW + 6),
        ],
    )
    def test_offline_at(self, state: LiveState, expected: float | None) -> None:
        assert domain.offline_at(state, LIVE_TIMING) == expected


def recorded(event: float) -> float:
    """An event's time as the store keeps it: the start of its second (``int(now)``)."""
    return float(int(event))


class TestFullGrace:
    """Never offline to others before the full OFFLINE_GRACE after a close (nor gone before the
    full CONNECTION_TTL after a heartbeat), though the store keeps only the event's second; and
    at most about one second later."""

    GRACE = LIVE_TIMING.offline_grace
    TTL = LIVE_TIMING.connection_ttl

    @pytest.mark.parametrize("close", [NOW + 0.0, NOW + 0.5, NOW + 0.9, NOW + 0.999])
    def test_the_grace_counts_from_the_close_not_from_its_second(self, close: float) -> None:
        state = LiveState(last_active=recorded(close), devices=(Device.WEB,), signed_off=True)
        grace_end = close + self.GRACE
        assert domain.live_status(state, grace_end - 0.01, LIVE_TIMING) is Status.ONLINE
        assert domain.live_status(state, grace_end + 1, LIVE_TIMING) is Status.OFFLINE
        deadline = domain.offline_at(state, LIVE_TIMING)
        assert deadline is not None and grace_end <= deadline <= grace_end + 1

    @pytest.mark.parametrize("beat", [NOW + 0.0, NOW + 0.5, NOW + 0.9, NOW + 0.999])
    def test_the_ttl_counts_from_the_heartbeat_not_from_its_second(self, beat: float) -> None:
        state = LiveState(last_active=recorded(beat), devices=(Device.WEB,), connected=True)
        ttl_end = beat + self.TTL
        assert domain.live_status(state, ttl_end - 0.01, LIVE_TIMING) is Status.ONLINE
        assert domain.live_status(state, ttl_end + 1, LIVE_TIMING) is Status.OFFLINE
        deadline = domain.offline_at(state, LIVE_TIMING)
        assert deadline is not None and ttl_end <= deadline <= ttl_end + 1

    def test_the_example_of_the_docs(self) -> None:
        # A tab closed at 100.9 s: online to friends at 100.9 + GRACE - 0.01, offline by
        # 100.9 + GRACE + 1 at the latest.
        closed = LiveState(last_active=recorded(100.9), signed_off=True)
        assert domain.live_status(closed, 100.9 + self.GRACE - 0.01, LIVE_TIMING) is Status.ONLINE
        assert domain.live_status(closed, 100.9 + self.GRACE + 1, LIVE_TIMING) is Status.OFFLINE
        beat = LiveState(last_active=recorded(100.9), connected=True)
        assert domain.live_status(beat, 100.9 + self.TTL - 0.01, LIVE_TIMING) is Status.ONLINE
        assert domain.live_status(beat, 100.9 + self.TTL + 1, LIVE_TIMING) is Status.OFFLINE


WEB_CONNECTED = LiveState(last_active=NOW - 30, devices=(Device.WEB,), connected=True)


class TestLiveNews:
    def news(self, before: LiveState, after: LiveState) -> bool:
        return domain.live_news(before, after, NOW, LIVE_TIMING)

    def test_a_heartbeat_that_only_moves_time_is_no_news(self) -> None:
        after = replace(WEB_CONNECTED, last_active=NOW)
        assert self.news(WEB_CONNECTED, after) is False
        # Also when an HTTP request is the first activity of a connected user.
        assert self.news(LiveState(last_active=NOW - 30, devices=(Device.WEB,)), after) is False

    def test_coming_online_is_news(self) -> None:
        assert self.news(LiveState(), replace(WEB_CONNECTED, last_active=NOW)) is True
        long_gone = LiveState(last_active=NOW - 3600, devices=(Device.WEB,))
        assert self.news(long_gone, replace(WEB_CONNECTED, last_active=NOW)) is True

    def test_idle_changes_are_news(self) -> None:
        idle = replace(WEB_CONNECTED, last_active=NOW, idle=True)
        assert self.news(WEB_CONNECTED, idle) is True
        assert self.news(idle, replace(WEB_CONNECTED, last_active=NOW)) is True

    def test_device_changes_are_news(self) -> None:
        both = replace(WEB_CONNECTED, last_active=NOW, devices=(Device.WEB, Device.MOBILE))
        assert self.news(WEB_CONNECTED, both) is True
        assert self.news(both, replace(both, devices=(Device.MOBILE,))) is True

    def test_close_of_the_last_connection_within_the_grace_is_no_news(self) -> None:
        closed = LiveState(last_active=NOW, devices=(Device.WEB,), signed_off=True)
        assert self.news(WEB_CONNECTED, closed) is False
        idle = replace(WEB_CONNECTED, idle=True)
        assert self.news(idle, replace(closed, idle=True)) is False

    def test_going_offline_is_news(self) -> None:
        expired = LiveState(last_active=NOW - 100, devices=(Device.WEB,), signed_off=True)
        assert self.news(WEB_CONNECTED, expired) is True

    def test_devices_of_an_offline_user_are_no_news(self) -> None:
        before = LiveState(last_active=NOW - 3600, devices=(Device.WEB,))
        after = LiveState(last_active=NOW - 3000, devices=(Device.MOBILE,), signed_off=True)
        assert self.news(before, after) is False
        assert self.news(LiveState(), after) is False

    def test_a_heartbeat_that_lands_after_the_ttl_ran_out_is_news(self) -> None:
        # Made a tenth of a second before the connection's TTL ran out, done a tenth after:
        # a reader in between saw the user offline, and must be told they are back.
        beat = LiveState(last_active=NOW, devices=(Device.WEB,), connected=True)
        last = LiveState(last_active=NOW - 90, devices=(Device.WEB,), connected=True)
        expiry = domain.offline_at(last, LIVE_TIMING)
        assert expiry is not None
        made, done = expiry - 0.1, expiry + 0.1
        assert domain.live_news(last, beat, made, LIVE_TIMING) is False
        assert domain.live_news(last, beat, made, LIVE_TIMING, until=done) is True
        # Done in time, it changed nothing anyone could see.
        assert domain.live_news(last, beat, made, LIVE_TIMING, until=expiry - 0.01) is False


class TestVisiblyDiffers:
    earlier = datetime.fromtimestamp(NOW - 30, tz=UTC)
    later = datetime.fromtimestamp(NOW, tz=UTC)

    def test_nothing_shown_yet(self) -> None:
        assert domain.visibly_differs(None, Presence()) is True

    def test_last_seen_ignored_while_both_are_online(self) -> None:
        assert (
            domain.visibly_differs(online(last_seen=self.earlier), online(last_seen=self.later))
            is False
        )
        idle = Presence(status=Status.IDLE, last_seen=self.earlier)
        assert domain.visibly_differs(idle, replace(idle, last_seen=self.later)) is False
        # ... but whether it is shown at all is news (a privacy change reaches open views).
        dnd = Presence(status=Status.DND, last_seen=self.earlier)
        assert domain.visibly_differs(dnd, replace(dnd, last_seen=self.later)) is False
        assert domain.visibly_differs(dnd, replace(dnd, last_seen=None)) is True

    def test_anything_else_counts_while_online(self) -> None:
        before = online(last_seen=self.earlier)
        for after in (
            replace(before, status=Status.IDLE),
            replace(before, status=Status.DND),
            replace(before, devices=("web", "mobile")),
            replace(before, text="hi"),
            replace(before, emoji="🙂"),
            replace(before, activity="reading"),
            replace(before, invisible=True),
        ):
            assert domain.visibly_differs(before, after) is True, after

    def test_every_field_but_last_seen_is_compared_while_online(self) -> None:
        before = online(last_seen=self.earlier)
        changed = {
            "status": Status.IDLE,
            "devices": ("mobile",),
            "text": "hi",
            "emoji": "🙂",
            "activity": "reading",
            "invisible": False,
            "last_seen_approx": domain.LastSeenApprox.WITHIN_WEEK,
            "expires_at": self.later,
        }
        # A field added to Presence must be compared too (or be listed here as exempt).
        assert {f.name for f in fields(Presence)} == {*changed, "last_seen"}
        for name, value in changed.items():
            assert domain.visibly_differs(before, replace(before, **{name: value})), name
        assert domain.visibly_differs(before, before) is False

    def test_last_seen_compared_when_either_is_offline(self) -> None:
        assert (
            domain.visibly_differs(Presence(last_seen=self.earlier), Presence(last_seen=self.later))
            is True
        )
        assert domain.visibly_differs(Presence(last_seen=self.earlier), Presence()) is True
        gone = Presence(last_seen=self.earlier)
        assert domain.visibly_differs(online(last_seen=self.earlier), gone) is True
        assert domain.visibly_differs(gone, online(last_seen=self.earlier)) is True
        assert domain.visibly_differs(gone, Presence(last_seen=self.earlier)) is False

    def test_invisible_flag_counts_when_offline(self) -> None:
        own = Presence(last_seen=self.earlier, invisible=False)
        assert domain.visibly_differs(own, replace(own, invisible=True)) is True
        assert domain.visibly_differs(own, replace(own)) is False


IDLE_CONNECTED = LiveState(
    last_active=NOW - 10, devices=(Device.MOBILE,), connected=True, idle=True
)


class TestResolveIdle:
    def test_idle_shown_to_permitted_viewers(self) -> None:
        assert domain.resolve(IDLE_CONNECTED, Choices(), CONTACT, NOW, LIVE_TIMING) == Presence(
            status=Status.IDLE,
            last_seen=datetime.fromtimestamp(NOW - 10, tz=UTC),
            devices=("mobile",),
        )

    def test_dnd_wins_over_idle(self) -> None:
        seen = domain.resolve(IDLE_CONNECTED, Choices(dnd=True), CONTACT, NOW, LIVE_TIMING)
        assert (seen.status, seen.devices) == (Status.DND, ("mobile",))
        own = domain.resolve(IDLE_CONNECTED, Choices(dnd=True), domain.SELF, NOW, LIVE_TIMING)
        assert (own.status, own.invisible) == (Status.DND, False)

    def test_self_sees_idle(self) -> None:
        own = domain.resolve(IDLE_CONNECTED, Choices(), domain.SELF, NOW, LIVE_TIMING)
        assert (own.status, own.devices, own.invisible) == (Status.IDLE, ("mobile",), False)

    @pytest.mark.parametrize(
        ("choices", "relation"),
        [
            (Choices(), STRANGER),
            (Choices(online_visibility=Visibility.CLOSE_FRIENDS), CONTACT),
            (everyone(invisible=True), CLOSE),
            (everyone(), BLOCKED_CONTACT),
        ],
    )
    def test_idle_hidden_from_viewers_not_permitted(
        self, choices: Choices, relation: Relation
    ) -> None:
        seen = domain.resolve(IDLE_CONNECTED, choices, relation, NOW, LIVE_TIMING)
        assert (seen.status, seen.last_seen, seen.devices) == (Status.OFFLINE, None, ())

    def test_idle_within_the_grace_after_the_last_connection_closed(self) -> None:
        closed = LiveState(last_active=NOW - 2, devices=(Device.WEB,), signed_off=True, idle=True)
        seen = domain.resolve(closed, Choices(), CONTACT, NOW, LIVE_TIMING)
        assert (seen.status, seen.devices) == (Status.IDLE, ("web",))
        seen = domain.resolve(closed, Choices(), CONTACT, NOW + 4, LIVE_TIMING)
        assert (seen.status, seen.devices) == (Status.OFFLINE, ())
        assert seen.last_seen == datetime.fromtimestamp(NOW - 2, tz=UTC)


class TestParseExtensionFrames:
    """Frame types added by installed apps (presence.extensions) reach parse_frame as parsers."""

    def test_an_added_type_is_parsed_by_its_parser(self) -> None:
        def parse(data: Any) -> tuple[str, Any]:
            if not isinstance(data.get("to"), int):
                raise InvalidInput("invalid_message", "'to' must be an int.")
            return ("typing", data["to"])

        extra = {"typing": parse}
        assert domain.parse_frame(
            json.dumps({"type": "typing", "to": 3}), LIMITS, extra
        ) == domain.Extension("typing", ("typing", 3))
        with pytest.raises(InvalidInput) as raised:
            domain.parse_frame(json.dumps({"type": "typing"}), LIMITS, extra)
        assert raised.value.code == "invalid_message"

    def test_presence_types_come_first(self) -> None:
        def hijack(data: Any) -> str:
            return "hijacked"

        frame = json.dumps({"type": "heartbeat"})
        assert domain.parse_frame(frame, LIMITS, {"heartbeat": hijack}) == domain.Heartbeat()

    def test_unknown_types_list_the_added_types(self) -> None:
        with translation.override("en"), pytest.raises(InvalidInput) as raised:
            domain.parse_frame(json.dumps({"type": "ping"}), LIMITS, {"typing": lambda d: d})
        assert raised.value.code == "unknown_type"
        assert raised.value.message == (
            "Unknown message type 'ping': use one of heartbeat, subscribe, unsubscribe, "
            "set_status, join, leave, room_more, watch_count, unwatch_count, watch_room_count, "
            "unwatch_room_count, typing."
        )
