"""The pure rules: fast, no Redis, no database.

The live layer's rules: tests/core/test_domain_live.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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
from presence.domain.display import script_words
from tests.core.domain_cases import BLOCKED_CONTACT, CLOSE, CONTACT, LIMITS, NOW, STRANGER, everyone

TIMING = Timing(online_window=300, offline_grace=5)
ONLINE = LiveState(last_active=NOW - 10, devices=(Device.WEB, Device.MOBILE))
LONG_GONE = LiveState(last_active=NOW - 3600, devices=(Device.WEB,))


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
        # Not even the day: the approximate last seen counts from the days before today, and
        # nothing earlier is known of this user (APPROXIMATE_LAST_SEEN).
        assert resolve(ONLINE, Choices(text="hi"), STRANGER) == Presence()

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

    def test_self_sees_when_the_custom_status_clears_and_no_one_else_does(self) -> None:
        """In one's own presence only (the status menu keeps its clearing time from it), and
        only while the custom status shows."""
        clears = NOW + 3600
        choices = everyone(text="Lunch", expires_at=clears)
        own = resolve(ONLINE, choices, domain.SELF)
        assert own.as_dict()["expires_at"] == datetime.fromtimestamp(clears, UTC).isoformat()
        assert "expires_at" not in resolve(ONLINE, choices, CLOSE).as_dict()
        for none_clears in (everyone(text="Lunch"), everyone(expires_at=clears)):
            assert "expires_at" not in resolve(ONLINE, none_clears, domain.SELF).as_dict()
        passed = resolve(ONLINE, everyone(text="Lunch", expires_at=NOW - 1), domain.SELF)
        assert (passed.text, passed.expires_at) == (None, None)

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

    @pytest.mark.parametrize("language", ["de", "fr", "ru"])
    def test_a_language_without_presences_words_gets_the_whole_phrase_in_english(
        self, language: str
    ) -> None:
        # Django's catalogs have "5 Minuten", not "... ago": no "5 Minuten ago". The page's
        # words for presence.js are the same as the server's.
        with translation.override(language):
            assert domain.humanize(self.seen(minutes=5), self.now) == "5\xa0minutes ago"
            assert domain.humanize(self.seen(days=1), self.now) == "1\xa0day ago"
            words = script_words()
        assert words["ago"] == "%(delta)s ago"
        assert words["units"]["minute"] == ["%(num)d minutes", {"1": "%(num)d minute"}]

    def test_a_language_with_presences_words_gets_them_all(self) -> None:
        with translation.override("ja"):
            assert domain.humanize(self.seen(minutes=5), self.now) == "5分前"
            words = script_words()
        assert words["ago"] == "%(delta)s前"
        assert words["units"]["minute"] == ["%(num)d分", {}]

    @pytest.mark.parametrize(
        ("seen", "english"),
        [
            ("2025-02-01T12:00:01", "3\xa0weeks ago"),  # 27 days: February has 28
            ("2025-02-01T12:00:00", "1\xa0month ago"),  # the day and the time reached again
            ("2025-01-31T12:00:00", "1\xa0month ago"),  # 28 February is no month: 1 March is
            ("2024-03-01T12:00:01", "11\xa0months ago"),
            ("2024-03-01T12:00:00", "1\xa0year ago"),
            ("2025-03-01T11:59:00.5", "1\xa0minute ago"),  # whole seconds, as the JSON has
            ("2025-03-01T11:59:01", "just now"),
        ],
    )
    def test_calendar_months_and_years_in_utc(self, seen: str, english: str) -> None:
        now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
        last_seen = datetime.fromisoformat(seen).replace(tzinfo=UTC)
        with translation.override("en"):
            assert domain.humanize(Presence(last_seen=last_seen), now) == english


class TestPassed:
    """A wait in wall-clock time: over once its seconds passed, and at once when the clock was
    stepped back past its start (it must not last the step's length too)."""

    def test_over_once_its_seconds_passed(self) -> None:
        assert not domain.passed(NOW + 9.9, NOW, 10)
        assert domain.passed(NOW + 10, NOW, 10)

    def test_over_at_once_when_the_clock_was_stepped_back(self) -> None:
        assert domain.passed(NOW - 3600, NOW, 10)
        assert domain.passed(NOW - 0.1, NOW, 10)

    def test_a_wait_of_nothing_is_always_over(self) -> None:
        assert domain.passed(NOW, NOW, 0)


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
