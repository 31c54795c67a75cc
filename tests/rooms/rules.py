"""Room rules (``can_enter``) for the rooms tests: named in PRESENCE["ROOMS"] by dotted path."""

from __future__ import annotations

from typing import Any


def even_ids_only(user: Any, room_id: str) -> bool:
    return room_id.isdigit() and int(room_id) % 2 == 0


def raises(user: Any, room_id: str) -> bool:
    raise RuntimeError("the rule of this site is broken")


NOT_CALLABLE = 42

ROOMS = {
    "post": None,
    "group": "tests.rooms.rules.even_ids_only",
    "broken": "tests.rooms.rules.raises",
}
