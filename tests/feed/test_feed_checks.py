"""presence.feed.checks: the activity feed's settings (PRESENCE_FEED), one test per id."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks

from presence import checks as presence_checks
from presence.conf import FEED_SETTING_NAMES as FEED_KEYS
from presence.feed.checks import check_settings
from presence.feed.conf import SETTING_NAMES


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
        ("CAN_READ", ""),
        ("CAN_READ", 5),
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


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("tests.feed_cases.no_such_rule", "does not import (ImportError"),
        ("no_such_module.rule", "does not import (ModuleNotFoundError"),
        (".rule", "does not import"),
        ("tests.feed_cases.MEMBERS_READ_GROUPS", "names a str, not a function"),
    ],
)
def test_e004_a_can_read_rule_that_names_no_function(
    settings: Any, path: str, problem: str
) -> None:
    settings.PRESENCE_FEED = {"CAN_READ": path}
    [message] = check_settings()
    assert message.id == "presence_feed.E004"
    assert f"= {path!r} {problem}" in message.msg
    assert "can_read(user, feed)" in message.hint


def test_a_can_read_rule_that_imports_passes(settings: Any) -> None:
    settings.PRESENCE_FEED = {"CAN_READ": "tests.feed_cases.members_read_groups"}
    assert check_settings() == []
    settings.PRESENCE_FEED = {"CAN_READ": None}
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


@pytest.mark.parametrize("key", sorted(FEED_KEYS))
def test_w002_alone_reports_a_feed_key_left_in_presence(settings: Any, key: str) -> None:
    # Not presence.W001 too ("unknown key", its hint listing presence's keys): one message.
    settings.PRESENCE = {key: "username"}
    settings.ASGI_APPLICATION = None  # W005 has tests of its own (the test database's options)
    found = [m.id for m in run_checks() if m.id and m.id.startswith("presence")]
    assert found == ["presence_feed.W002"]


def test_without_the_feed_a_feed_key_in_presence_is_w001_saying_where_it_belongs(
    settings: Any,
) -> None:
    # A site with presence alone (tests/settings/core_only.py): the feed's checks never load.
    settings.INSTALLED_APPS = [
        app for app in settings.INSTALLED_APPS if app not in {"presence.feed", "siteproject.demo"}
    ]
    settings.PRESENCE = {"HANDLE_FIELD": "username", "ONLINE_WINDOWS": 300}
    warnings = presence_checks.check_settings()
    assert [m.id for m in warnings] == ["presence.W001", "presence.W001"]
    feed_key, typo = warnings
    assert "'HANDLE_FIELD'" in feed_key.msg
    assert "PRESENCE_FEED" in (feed_key.hint or "") and "presence.feed" in (feed_key.hint or "")
    assert "'ONLINE_WINDOWS'" in typo.msg and "Known keys" in (typo.hint or "")


def test_the_core_knows_the_feeds_setting_names() -> None:
    # presence.conf names them itself: the core may not import the feed (make lint's layers).
    assert FEED_KEYS == SETTING_NAMES


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
    settings.PRESENCE_FEED = {"HANDLE_FIELD": "username"}
    assert check_settings() == []


def test_w003_a_handle_field_that_is_not_unique_is_reported(settings: Any) -> None:
    settings.PRESENCE_FEED = {"HANDLE_FIELD": "first_name"}
    [message] = check_settings()
    assert message.id == "presence_feed.W003"
    assert "not unique" in message.msg and "unique" in message.hint
    settings.PRESENCE_FEED = {"HANDLE_FIELD": "username"}  # unique: nothing to report
    assert check_settings() == []


def test_w003_a_unique_constraint_on_the_handle_makes_it_unique(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.contrib.auth import get_user_model
    from django.db.models import Q, UniqueConstraint
    from django.db.models.functions import Lower

    meta = get_user_model()._meta
    settings.PRESENCE_FEED = {"HANDLE_FIELD": "first_name"}
    for unique in (
        UniqueConstraint(fields=["first_name"], name="one_first_name"),
        UniqueConstraint(Lower("first_name"), name="one_first_name_in_any_case"),
    ):
        monkeypatch.setattr(meta, "constraints", [*meta.constraints, unique])
        assert check_settings() == []
        monkeypatch.undo()
    # Unique only with another field, or only on some rows: two users may share a handle.
    for partial in (
        UniqueConstraint(fields=["first_name", "last_name"], name="one_full_name"),
        UniqueConstraint(fields=["first_name"], condition=Q(is_staff=True), name="one_staff"),
    ):
        monkeypatch.setattr(meta, "constraints", [*meta.constraints, partial])
        assert ids(check_settings()) == ["presence_feed.W003"]
        monkeypatch.undo()
