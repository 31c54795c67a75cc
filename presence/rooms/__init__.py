"""Rooms (docs/rooms.md): who is in a room, as a viewer may see it, live.

- :mod:`~presence.rooms.rule` -- who may enter a room (``ROOMS``), and the rules asked again;
- :mod:`~presence.rooms.reading` -- a room as a viewer sees it (:func:`room_presence`);
- :mod:`~presence.rooms.counts` -- many rooms' counts for one viewer (:func:`room_counts`);
- :mod:`~presence.rooms.candidates` -- the facts and live state of a read's candidates;
- :mod:`~presence.rooms.cards` -- how a listed member is shown: a name and an avatar;
- :mod:`~presence.rooms.writes` -- joins, leaves, renewals and the sweep, announced;
- :mod:`~presence.rooms.delta` -- a window's changed users, for the hub's ``room_diff``;
- :mod:`~presence.rooms.live` -- one connection's rooms: the join and what undoes it;
- :mod:`~presence.rooms.paging` -- the next page of a room's members after a cursor
  (:mod:`~presence.rooms.cursors`).

The pure rules (a room's name, who is listed and counted) are :mod:`presence.domain.rooms`.
"""

from __future__ import annotations

from presence.rooms.cards import (
    amember_card,
    awith_names,
    display_name,
    member_card,
    with_names,
)
from presence.rooms.counts import aroom_counts, room_counts
from presence.rooms.paging import aroom_page, room_page
from presence.rooms.reading import aroom_presence, room_presence, room_state
from presence.rooms.rule import UnknownRoom, arecheck_room, recheck_room

__all__ = [
    "UnknownRoom",
    "amember_card",
    "arecheck_room",
    "aroom_counts",
    "aroom_page",
    "aroom_presence",
    "awith_names",
    "display_name",
    "member_card",
    "recheck_room",
    "room_counts",
    "room_page",
    "room_presence",
    "room_state",
    "with_names",
]
