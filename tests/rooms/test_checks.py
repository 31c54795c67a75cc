"""presence.E011 (ROOMS not a dict of kinds to dotted paths or None), presence.E012 (a rule
that does not import or is not callable), and MAX_ROOMS / MAX_WATCHED_ROOMS / ROOM_LIST_LIMIT
(presence.E002)."""

from __future__ import annotations

from typing import Any

import pytest

from presence import checks
from presence.conf import get_settings
from tests.rooms.rules import ROOMS


def ids(settings: Any, presence: Any) -> list[str]:
    settings.PRESENCE = presence
    return [m.id for m in checks.check_settings() if m.id is not None]


def test_good_rooms_pass(settings: Any) -> None:
    assert ids(settings, {"ROOMS": {}}) == []
    assert ids(settings, {"ROOMS": ROOMS, "MAX_ROOMS": 3, "ROOM_LIST_LIMIT": 20}) == []
    conf = get_settings()
    assert conf.MAX_ROOMS == 3 and conf.ROOM_LIST_LIMIT == 20 and conf.ROOMS == ROOMS


def test_defaults() -> None:
    conf = get_settings()
    assert (conf.ROOMS, conf.MAX_ROOMS, conf.ROOM_LIST_LIMIT) == ({}, 10, 100)


@pytest.mark.parametrize(
    "rooms",
    [
        ["post"],
        "post",
        {"Post": None},
        {"1post": None},
        {"": None},
        {3: None},
        {"post": 3},
        {"post": ""},
    ],
)
def test_e011_rooms_of_the_wrong_shape(settings: Any, rooms: Any) -> None:
    assert ids(settings, {"ROOMS": rooms}) == ["presence.E011"]
    # Meanwhile presence runs: a kind that is not a kind is never entered.
    assert "post" not in get_settings().ROOMS or get_settings().ROOMS["post"] in (3, "")


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("tests.rooms.rules.no_such_rule", "does not import"),
        ("no.such.module.rule", "does not import"),
        ("norule", "does not import"),
        ("tests.rooms.rules.NOT_CALLABLE", "not a function"),
        (".can_enter", "does not import (ValueError"),
        ("..x.y", "does not import (TypeError"),
        ("tests.rooms.raises_on_import.can_enter", "does not import (RuntimeError"),
    ],
)
def test_e012_a_rule_that_does_not_import_or_call(settings: Any, path: str, said: str) -> None:
    settings.PRESENCE = {"ROOMS": {"post": path, "lobby": None}}
    (message,) = checks.check_settings()
    assert message.id == "presence.E012"
    assert said in message.msg and "'post'" in message.msg
    assert message.hint


@pytest.mark.parametrize("key", ["MAX_ROOMS", "MAX_WATCHED_ROOMS", "ROOM_LIST_LIMIT"])
@pytest.mark.parametrize("value", [0, -1, 1.5, "10", True, None])
def test_room_numbers_are_positive_ints(settings: Any, key: str, value: Any) -> None:
    assert ids(settings, {key: value}) == ["presence.E002"]
