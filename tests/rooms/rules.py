"""Room rules (``can_enter``) for the rooms tests: named in PRESENCE["ROOMS"] by dotted path."""

from __future__ import annotations

from typing import Any


def even_ids_only(user: Any, room_id: str) -> bool:
    return room_id.isdigit() and int(room_id) % 2 == 0


def raises(user: Any, room_id: str) -> bool:
    raise RuntimeError("the rule of this site is broken")


#: the (user pk, room id) pairs :func:`revocable` refuses now (a test takes access away here)
refused: set[tuple[Any, str]] = set()
#: every (user pk, room id) :func:`revocable` was asked for, in order
asked: list[tuple[Any, str]] = []


def revocable(user: Any, room_id: str) -> bool:
    """A rule a test can turn: everyone may enter, but the pairs in :data:`refused`."""
    asked.append((user.pk, room_id))
    return (user.pk, room_id) not in refused


def in_group(user: Any, room_id: str) -> bool:
    """Members of the auth group ``club-<id>``: a rule on the database, which every process
    (the daphne ones of tests/rooms/test_processes.py too) reads alike."""
    return bool(user.groups.filter(name=f"club-{room_id}").exists())


NOT_CALLABLE = 42

ROOMS = {
    "post": None,
    "group": "tests.rooms.rules.even_ids_only",
    "broken": "tests.rooms.rules.raises",
}

#: ROOMS with kinds whose rules do not import (presence.E012): their rooms refuse everyone
WITH_A_MISSING_RULE = {
    **ROOMS,
    "missing": "tests.rooms.rules.no_such_rule",
    "relative": ".can_enter",
    "raising": "tests.rooms.raises_on_import.can_enter",
}
