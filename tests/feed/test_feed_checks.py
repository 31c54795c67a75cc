"""presence.feed.checks: the activity feed's settings (PRESENCE_FEED), one test per id."""

from __future__ import annotations

from typing import Any

import pytest

from presence.feed.checks import check_settings


def ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def test_e001_presence_feed_must_be_a_dict(settings: Any) -> None:
    settings.PRESENCE_FEED = ["ACTIVITY_MAX_LENGTH", 10]
    [message] = check_settings()
    assert message.id == "presence_feed.E001"
    assert "PRESENCE_FEED" in message.hint


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("ACTIVITY_MAX_LENGTH", 0),
        ("ACTIVITY_MAX_LENGTH", "500"),
        ("ACTIVITY_MAX_LENGTH", True),
        ("RECORD_STATUS_ACTIVITIES", "yes"),
        ("RECORD_STATUS_ACTIVITIES", 1),
        ("MENTION_URL", ""),
        ("MENTION_URL", 5),
        ("HANDLE_FIELD", ""),
        ("HANDLE_FIELD", 3),
    ],
)
def test_feed_settings_are_checked(settings: Any, key: str, bad: Any) -> None:
    settings.PRESENCE_FEED = {key: bad}
    assert [m.id for m in check_settings()] == ["presence_feed.E002"]


def test_good_feed_settings_pass_the_checks(settings: Any) -> None:
    settings.PRESENCE_FEED = {
        "ACTIVITY_MAX_LENGTH": 280,
        "RECORD_STATUS_ACTIVITIES": True,
        "MENTION_URL": "demo:profile",
    }
    assert check_settings() == []
    settings.PRESENCE_FEED = {"MENTION_URL": None, "RECORD_STATUS_ACTIVITIES": False}
    assert check_settings() == []


def test_w001_unknown_keys_are_reported(settings: Any) -> None:
    settings.PRESENCE_FEED = {"ACTIVITY_MAX_LEN": 10}
    [message] = check_settings()
    assert message.id == "presence_feed.W001"
    assert "ACTIVITY_MAX_LENGTH" in message.hint


@pytest.mark.parametrize("key", ["ACTIVITY_MAX_LENGTH", "RECORD_STATUS_ACTIVITIES", "MENTION_URL"])
def test_w002_feed_keys_left_in_presence_are_reported(settings: Any, key: str) -> None:
    settings.PRESENCE = {key: "x"}
    [message] = check_settings()
    assert message.id == "presence_feed.W002"
    assert f"PRESENCE_FEED = {{{key!r}" in message.hint


def test_feed_keys_left_in_presence_are_not_used(settings: Any) -> None:
    from presence.feed.conf import get_settings

    settings.PRESENCE = {"ACTIVITY_MAX_LENGTH": 10}
    assert get_settings().ACTIVITY_MAX_LENGTH == 500
    settings.PRESENCE_FEED = {"ACTIVITY_MAX_LENGTH": 10}
    assert get_settings().ACTIVITY_MAX_LENGTH == 10


def test_e003_handle_field_must_name_a_field_of_the_user_model(settings: Any) -> None:
    settings.PRESENCE_FEED = {"HANDLE_FIELD": "nickname"}
    [message] = check_settings()
    assert message.id == "presence_feed.E003"
    assert "'nickname'" in message.msg and "USERNAME_FIELD" in message.hint
    settings.PRESENCE_FEED = {"HANDLE_FIELD": "first_name"}
    assert check_settings() == []
