"""The pure rules: fast, no Redis, no database."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta
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

NOW = 1_800_000_000.0
TIMING = Timing(online_window=300, offline_grace=5)
LIMITS = domain.Limits(text_max_length=10, emoji_max_length=4, max_expiry=3600)

ONLINE = LiveState(last_active=NOW - 10, devices=(Device.WEB, Device.MOBILE))
LONG_GONE = LiveState(last_active=NOW - 3600, devices=(Device.WEB,))

CONTACT = Relation(is_contact=True)
CLOSE = Relation(is_contact=True, is_close_friend=True)
STRANGER = Relation()
BLOCKED_CONTACT = Relation(is_contact=True, is_close_friend=True, blocked=True)


def everyone(**extra: object) -> Choices:
    return Choices(
        online_visibility=Visibility.EVERYONE,
        last_seen_visibility=Visibility.EVERYONE,
        activity_visibility=Visibility.EVERYONE,
        **extra,  # type: ignore[arg-type]
    )


def resolve(live: LiveState, choices: Choices, relation: Relation) -> Presence:
    return domain.resolve(live, choices, relation, NOW, TIMING)


class TestLiveStatus:
    def test_unknown_user_is_offline(self) -> None:
        assert domain.live_status(LiveState(), NOW, TIMING) is Status.OFFLINE

    @pytest.mark.parametrize(
        ("ago", "expected"), [(0, "online"), (299, "online"), (300, "offline")]
    )
    def test_online_within_window(self, ago: int, expected: str) -> None:
        assert domain.live_status(LiveState(last_active=NOW - ago), NOW, TIMING) == expected

    # The grace counts from the end of the second recorded (see TestFullGrace).
    @pytest.mark.parametrize(
        ("ago", "expected"), [(0, "online"), (5, "online"), (5.99, "online"), (6, "offline")]
    )
    def test_signed_off_goes_offline_after_grace(self, ago: float, expected: str) -> None:
        state = LiveState(last_active=NOW - ago, signed_off=True)
        assert domain.live_status(state, NOW, TIMING) == expected


class TestResolve:
    def test_defaults_show_contacts_everything(self) -> None:
        seen = resolve(ONLINE, Choices(text="hi"), CONTACT)
        assert seen.status is Status.ONLINE
        assert seen.last_seen == datetime.fromtimestamp(NOW - 10, tz=UTC)
        assert set(seen.devices) == {"web", "mobile"}
        assert seen.text == "hi"
        assert seen.invisible is None

    def test_defaults_hide_everything_from_strangers(self) -> None:
        assert resolve(ONLINE, Choices(text="hi"), STRANGER) == domain.HIDDEN

    @pytest.mark.parametrize("choices", [everyone(), everyone(invisible=True)])
    def test_block_hides_everything_whatever_the_settings(self, choices: Choices) -> None:
        assert resolve(ONLINE, Choices(text="x", dnd=True), BLOCKED_CONTACT) == domain.HIDDEN
        assert resolve(ONLINE, choices, BLOCKED_CONTACT) == domain.HIDDEN

    def test_invisible_looks_offline_without_last_seen(self) -> None:
        seen = resolve(ONLINE, everyone(invisible=True, text="away"), CLOSE)
        assert (seen.status, seen.last_seen, seen.devices) == (Status.OFFLINE, None, ())
        assert seen.text == "away"

    def test_self_sees_truth_and_invisible_flag(self) -> None:
        choices = Choices(
            online_visibility=Visibility.NOBODY,
            last_seen_visibility=Visibility.NOBODY,
            activity_visibility=Visibility.NOBODY,
            invisible=True,
            dnd=True,
            text="secret",
        )
        seen = resolve(ONLINE, choices, domain.SELF)
        assert seen.status is Status.DND
        assert seen.invisible is True
        assert seen.text == "secret"
        assert seen.last_seen is not None
        assert seen.as_dict()["invisible"] is True

    @pytest.mark.parametrize(
        ("level", "relation", "visible"),
        [
            (Visibility.EVERYONE, STRANGER, True),
            (Visibility.CONTACTS, STRANGER, False),
            (Visibility.CONTACTS, CONTACT, True),
            (Visibility.CLOSE_FRIENDS, CONTACT, False),
            (Visibility.CLOSE_FRIENDS, CLOSE, True),
            (Visibility.NOBODY, CLOSE, False),
        ],
    )
    def test_online_visibility(self, level: Visibility, relation: Relation, visible: bool) -> None:
        choices = Choices(
            online_visibility=level,
            last_seen_visibility=Visibility.EVERYONE,
            dnd=True,
        )
        seen = resolve(ONLINE, choices, relation)
        assert seen.status is (Status.DND if visible else Status.OFFLINE)
        assert bool(seen.devices) is visible
        # A fresh last seen would give away "online", so it follows online visibility too.
        assert (seen.last_seen is not None) is visible

    def test_last_seen_hidden_while_online_still_visible(self) -> None:
        choices = Choices(last_seen_visibility=Visibility.NOBODY)
        seen = resolve(LONG_GONE, choices, CONTACT)
        assert (seen.status, seen.last_seen) == (Status.OFFLINE, None)
        seen = resolve(ONLINE, choices, CONTACT)
        assert (seen.status, seen.last_seen) == (Status.ONLINE, None)

    def test_activity_visibility_governs_custom_status(self) -> None:
        choices = Choices(
            activity_visibility=Visibility.CLOSE_FRIENDS, text="t", emoji="e", activity="a"
        )
        assert (
            resolve(ONLINE, choices, CONTACT).text,
            resolve(ONLINE, choices, CONTACT).emoji,
        ) == (
            None,
            None,
        )
        close = resolve(ONLINE, choices, CLOSE)
        assert (close.text, close.emoji, close.activity) == ("t", "e", "a")

    def test_custom_status_clears_at_expiry_but_dnd_stays(self) -> None:
        expiring = Choices(dnd=True, text="lunch", expires_at=NOW)
        seen = resolve(ONLINE, expiring, CONTACT)
        assert (seen.status, seen.text) == (Status.DND, None)
        later = Choices(dnd=True, text="lunch", expires_at=NOW + 1)
        assert resolve(ONLINE, later, CONTACT).text == "lunch"

    def test_dnd_never_shows_for_offline_user(self) -> None:
        assert resolve(LONG_GONE, Choices(dnd=True), CONTACT).status is Status.OFFLINE

    def test_last_seen_is_the_later_of_redis_and_database(self) -> None:
        newer_in_db = Choices(persisted_last_seen=NOW - 100)
        assert resolve(LONG_GONE, newer_in_db, CONTACT).last_seen == datetime.fromtimestamp(
            NOW - 100, tz=UTC
        )
        only_db = resolve(LiveState(), Choices(persisted_last_seen=NOW - 7200), CONTACT)
        assert only_db.last_seen == datetime.fromtimestamp(NOW - 7200, tz=UTC)
        assert only_db.status is Status.OFFLINE

    def test_devices_hidden_when_offline(self) -> None:
        assert resolve(LONG_GONE, everyone(), STRANGER).devices == ()


class TestDevices:
    @pytest.mark.parametrize(
        ("user_agent", "device"),
        [
            (None, Device.WEB),
            ("Mozilla/5.0 (X11; Linux x86_64) Chrome/120", Device.WEB),
            ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) Mobile/15E148", Device.MOBILE),
            ("Mozilla/5.0 (Linux; Android 14; Pixel 8)", Device.MOBILE),
            ("Mozilla/5.0 (Macintosh) MyChat/1.0 Electron/30.0", Device.DESKTOP),
        ],
    )
    def test_device_from_user_agent(self, user_agent: str | None, device: Device) -> None:
        assert domain.device_from_user_agent(user_agent) is device

    def test_mask_round_trip(self) -> None:
        for mask in range(domain.DEVICE_MASK_LIMIT):
            # Encoded as the store does: its scripts OR together the DEVICE_BITS of each device.
            encoded = 0
            for device in domain.devices_from_mask(mask):
                encoded |= domain.DEVICE_BITS[device]
            assert encoded == mask


class TestHumanize:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def seen(self, **ago: float) -> Presence:
        return Presence(last_seen=self.now - timedelta(**ago))

    @pytest.mark.parametrize(
        ("presence", "english", "japanese"),
        [
            (Presence(status=Status.ONLINE), "online", "オンライン"),
            (Presence(), "", ""),
        ],
    )
    def test_online_and_hidden(self, presence: Presence, english: str, japanese: str) -> None:
        with translation.override("en"):
            assert domain.humanize(presence, self.now) == english
        with translation.override("ja"):
            assert domain.humanize(presence, self.now) == japanese

    def test_relative_times(self) -> None:
        with translation.override("en"):
            assert domain.humanize(self.seen(seconds=30), self.now) == "just now"
            assert domain.humanize(self.seen(minutes=5), self.now) == "5\xa0minutes ago"
            assert domain.humanize(self.seen(hours=2, minutes=10), self.now) == "2\xa0hours ago"
            assert domain.humanize(self.seen(days=3), self.now) == "3\xa0days ago"


class TestParseStatusChange:
    def test_valid_change(self) -> None:
        change = domain.parse_status_change(
            {"status": "dnd", "text": "  focus  ", "emoji": "🎧", "expires_in": 60}, LIMITS
        )
        assert change == domain.StatusChange(
            status=domain.StatusChoice.DND, text="focus", emoji="🎧", expires_in=60
        )

    def test_empty_text_means_none(self) -> None:
        assert domain.parse_status_change({"status": "auto", "text": "  "}, LIMITS).text is None

    @pytest.mark.parametrize(
        ("data", "code"),
        [
            ([], "invalid_message"),
            ({}, "invalid_message"),
            ({"status": 3}, "invalid_message"),
            ({"status": "busy"}, "invalid_value"),
            ({"status": "auto", "text": 5}, "invalid_message"),
            ({"status": "auto", "text": "x" * 11}, "invalid_value"),
            ({"status": "auto", "emoji": "🙂🙂🙂🙂🙂"}, "invalid_value"),
            ({"status": "auto", "text": "a\nb"}, "invalid_value"),
            ({"status": "auto", "expires_in": "60"}, "invalid_message"),
            ({"status": "auto", "expires_in": True}, "invalid_message"),
            ({"status": "auto", "expires_in": 0}, "invalid_value"),
            ({"status": "auto", "expires_in": -5}, "invalid_value"),
            ({"status": "auto", "expires_in": 0.5}, "invalid_value"),
            ({"status": "auto", "expires_in": 3601}, "invalid_value"),
        ],
    )
    def test_bad_input_names_the_problem(self, data: object, code: str) -> None:
        with pytest.raises(InvalidInput) as info:
            domain.parse_status_change(data, LIMITS)
        assert info.value.code == code
        assert info.value.message


def test_error_messages_follow_the_active_language() -> None:
    with translation.override("ja"), pytest.raises(InvalidInput) as info:
        domain.parse_status_change({"status": "auto", "expires_in": 0}, LIMITS)
    assert info.value.message == "'expires_in' は 1 から 3600 秒の間でなければなりません。"


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
                "set_status."
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


def online(**fields: Any) -> Presence:
    return Presence(status=Status.ONLINE, devices=("web",), **fields)


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
        dnd = Presence(status=Status.DND, last_seen=None)
        assert domain.visibly_differs(dnd, replace(dnd, last_seen=self.later)) is False

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
            "set_status, typing."
        )


# --- text the one rule refuses (check_text) ---------------------------------------------------

#: each unstorable or misleading input, named for the test ids
BAD_TEXT = {
    "lone-high-surrogate": "hi \ud800",
    "lone-low-surrogate": "\udc00",
    "nul": "a\x00b",
    "bell": "bell\x07",
    "del": "del\x7f",
    "c1-control": "next\x85line",
    "right-to-left-override": "evil\u202egnp.exe",
    "left-to-right-mark": "a\u200eb",
    "bom": "\ufeffhi",
    "word-joiner": "a\u2060b",
    "language-tag": "\U000e0001en",
}
#: text and emoji real people send: ZWJ sequences, tag flags, VS16, skin tones, ZWNJ
GOOD_TEXT = {
    "family-zwj": "\U0001f468\u200d\U0001f469\u200d\U0001f467",
    "technologist-zwj": "\U0001f469\U0001f3fd\u200d\U0001f4bb",
    # black flag, tags "gbeng", cancel tag
    "flag-of-england-tags": "\U0001f3f4"
    + "".join(chr(0xE0000 + ord(c)) for c in "gbeng")
    + "\U000e007f",
    "red-heart-vs16": "\u2764\ufe0f",
    "rainbow-flag": "\U0001f3f3\ufe0f\u200d\U0001f308",
    "persian-zwnj": "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
    "accents-and-cjk": "Café 東京",
}


@pytest.mark.parametrize("text", BAD_TEXT.values(), ids=BAD_TEXT.keys())
def test_check_text_refuses_unstorable_and_invisible_characters(text: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        domain.check_text(text, "text")
    assert raised.value.code == "invalid_value"
    assert "'text'" in raised.value.message


@pytest.mark.parametrize("text", GOOD_TEXT.values(), ids=GOOD_TEXT.keys())
def test_check_text_keeps_what_emoji_and_scripts_need(text: str) -> None:
    assert domain.check_text(text, "emoji") == text


def test_check_text_allows_line_breaks_and_tabs_only_when_multiline() -> None:
    assert domain.check_text("one\ntwo\tthree", "text", multiline=True) == "one\ntwo\tthree"
    for text in ("one\ntwo", "a\tb"):
        with pytest.raises(InvalidInput):
            domain.check_text(text, "text")
    for text in ("a\x00b", "a\rb", "a\ud800"):
        with pytest.raises(InvalidInput):
            domain.check_text(text, "text", multiline=True)


@pytest.mark.parametrize("field", ["text", "emoji", "activity"])
@pytest.mark.parametrize("bad", BAD_TEXT.values(), ids=BAD_TEXT.keys())
def test_status_change_refuses_bad_text_in_every_field(field: str, bad: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        domain.parse_status_change({"status": "auto", field: bad[:16]}, LIMITS_FOR_TEXT)
    assert raised.value.code == "invalid_value"
    assert f"'{field}'" in raised.value.message


@pytest.mark.parametrize("field", ["text", "emoji", "activity"])
def test_status_change_keeps_emoji_sequences(field: str) -> None:
    flag = GOOD_TEXT["flag-of-england-tags"]
    change = domain.parse_status_change({"status": "auto", field: flag}, LIMITS_FOR_TEXT)
    assert getattr(change, field) == flag


def test_a_set_status_frame_with_a_lone_surrogate_is_invalid_value() -> None:
    # JSON can spell a lone surrogate; json.loads lets it through into a str.
    frame = '{"type": "set_status", "status": "auto", "text": "\\ud83d"}'
    with pytest.raises(InvalidInput) as raised:
        domain.parse_frame(frame, LIMITS_FOR_TEXT)
    assert raised.value.code == "invalid_value"


LIMITS_FOR_TEXT = domain.Limits(text_max_length=140, emoji_max_length=16, max_expiry=3600)
