"""Rooms, counted: how many members each of many rooms has now, as one viewer may see them
(:func:`room_counts`): a list page's "3 here" beside each topic, live event or channel.

A batch costs one trip to the database's thread (each room's rule, and the viewer's blocks
either way: one query) and one Redis round trip (one per master on a cluster), whatever the
number of rooms: each room's read is its O(log n) count, its invisible members present and
which of the viewer's blocked users are present, with no member listed and no member's facts
read. The count is :func:`~presence.rooms.reading.room_presence`'s, by the rule a live view's
count follows (presence.rooms.delta): the members present, minus the invisible ones and those
a block stands between the viewer and them; the viewer always counts themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import PermissionDenied
from django.utils.translation import gettext

from presence import relations, resolution
from presence.conf import get_settings
from presence.domain import InvalidInput, UserId
from presence.domain.rooms import Room, parse_room
from presence.operations import Operation, arun, call, redis, run
from presence.rooms.rule import UnknownRoom, may_enter, room_rule
from presence.store import StoreUnavailable, get_store, merge
from presence.store.plans.rooms import RoomRead
from presence.users import viewer_pk


def room_limit() -> int:
    """Rooms one batch may count: ROOM_LIST_LIMIT, what a page shows of one room's members
    (a list page shows about as many rooms)."""
    return get_settings().ROOM_LIST_LIMIT


def parse_rooms(rooms: Iterable[Any]) -> list[Room]:
    """The rooms named (``"kind:id"`` or ``(kind, id)``), each once, in order: InvalidInput
    ``invalid_value`` for a malformed name, ``too_many_rooms`` past :func:`room_limit`, and
    :class:`~presence.rooms.rule.UnknownRoom` for an undeclared kind, before any I/O."""
    names = distinct_rooms(rooms)
    for name in names:
        room_rule(name)
    return names


def distinct_rooms(rooms: Iterable[Any]) -> list[Room]:
    """:func:`parse_rooms`, but whether each kind is declared is not asked (InvalidInput
    alone)."""
    if isinstance(rooms, str | tuple):
        # One room's name (a string, or a (kind, id) pair) would be read as many rooms.
        raise InvalidInput("invalid_value", gettext("Give a list of rooms, not one room."))
    names = list(dict.fromkeys(parse_room(room) for room in rooms))
    limit = room_limit()
    if len(names) > limit:
        raise InvalidInput(
            "too_many_rooms",
            gettext("At most %(limit)d rooms are counted at once (%(count)d asked).")
            % {"limit": limit, "count": len(names)},
        )
    return names


def _entry(viewer: Any, names: list[Room]) -> tuple[list[bool], set[UserId]]:
    """Whether the viewer may enter each room, and the users a block stands between the viewer
    and them (read only if some room lets the viewer in): one trip to the database's thread."""
    allowed = [may_enter(viewer, name) for name in names]
    if not any(allowed):
        return allowed, set()
    viewer_id = viewer_pk(viewer)
    return allowed, relations.blocks_between([viewer_id]).get(viewer_id, set())


def count_for(read: RoomRead | None, viewer_id: UserId, blocked: set[UserId]) -> int:
    """A room's count for the viewer (room_presence's): its members present but the invisible
    ones and those blocked either way, the viewer counted whatever they chose; 0 when Redis
    could not be read (room_presence reads the room empty then)."""
    if read is None:
        return 0
    left_out = (read.invisible | (blocked & read.found)) - {viewer_id}
    return max(read.present - len(left_out), 0)


def _room_counts(
    rooms: Iterable[Any], viewer: Any, raise_refused: bool, strict: bool = False
) -> Operation[dict[str, int | None]]:
    """Each room's count for ``viewer``, by its name; a room whose rule refuses the viewer
    (anonymous viewers included) raises PermissionDenied, or reads None unless
    ``raise_refused``. ``strict``: a room Redis could not read raises StoreUnavailable (not
    counted 0: nobody here would be false)."""
    names = parse_rooms(rooms)
    if not names:
        return {}
    allowed, blocked = yield from call(_entry, viewer, names)
    refused = [name for name, ok in zip(names, allowed, strict=True) if not ok]
    if refused and raise_refused:
        raise PermissionDenied(
            gettext("You may not see who is in the room %(room)s.") % {"room": refused[0].name}
        )
    counted = [name for name, ok in zip(names, allowed, strict=True) if ok]
    counts: dict[str, int | None] = {name.name: None for name in refused}
    if counted:
        now = resolution.now()
        viewer_id = viewer_pk(viewer)
        lookups = sorted(blocked, key=str)
        store = get_store()
        # One script per room, all in one pipeline (one round trip per master).
        reads = yield from redis(
            merge([store.plans.read_room(name.name, now, 0, lookups) for name in counted])
        )
        for name, read in zip(counted, reads, strict=True):
            if read is None and strict:
                raise StoreUnavailable("Redis is unavailable: the rooms were not counted")
            counts[name.name] = count_for(read, viewer_id, blocked)
    return {name.name: counts[name.name] for name in names}


def room_counts(rooms: Iterable[Any], viewer: Any) -> dict[str, int]:
    """How many members each room has now as ``viewer`` may see them, by room name
    (``{"topic:7": 3, ...}``): each one ``room_presence(room, viewer)["count"]``, all in one
    trip to the database and one Redis round trip (one per master on a cluster).

    ``rooms``: names (``"kind:id"``) or ``(kind, id)`` pairs, at most ROOM_LIST_LIMIT distinct
    ones. Raises as room_presence does, for the first room at fault, before any Redis read:
    InvalidInput (``invalid_value``) for a malformed name, :class:`UnknownRoom` for an
    undeclared kind, PermissionDenied where a room's rule refuses the viewer (anonymous
    viewers included); InvalidInput ``too_many_rooms`` past the limit. While Redis is
    unavailable every room counts 0, as room_presence reads it empty."""
    found = run(_room_counts(rooms, viewer, True))
    return {name: count or 0 for name, count in found.items()}


async def aroom_counts(rooms: Iterable[Any], viewer: Any) -> dict[str, int]:
    found = await arun(_room_counts(rooms, viewer, True))
    return {name: count or 0 for name, count in found.items()}


def polled_room_counts(rooms: Iterable[Any], viewer: Any) -> dict[str, int | None]:
    """The counts endpoint's (a page's poll, presence.js): :func:`room_counts`, but a room the
    viewer may not see reads None, as the tag shows it as nothing: refused by its rule, or of
    a kind the site does not declare (any more). One room taken away after the page rendered
    must not fail the whole batch: every other count on the page would stop. Raises
    InvalidInput for a malformed name or too many rooms, before any I/O, and StoreUnavailable
    while Redis cannot be read (a poll is told to try again, not shown empty rooms)."""
    names = distinct_rooms(rooms)
    declared = [name for name in names if _is_declared(name)]
    found = run(_room_counts(declared, viewer, False, strict=True)) if declared else {}
    return {name.name: found.get(name.name) for name in names}


def _is_declared(room: Room) -> bool:
    try:
        room_rule(room)
    except UnknownRoom:
        return False
    return True


def visible_room_counts(rooms: Iterable[Any], viewer: Any) -> dict[str, int | None]:
    """:func:`room_counts`, a room the viewer may not enter reading None instead of raising
    (what the template tags show as nothing)."""
    return run(_room_counts(rooms, viewer, False))


# --- live counts (watch_room_count: presence.hub.room_counts) ---------------------------------


def _watched_count(room: Room, viewer: Any) -> Operation[int | None]:
    """``room``'s count for ``viewer``, whom its rule must let in (PermissionDenied otherwise,
    before any Redis read), as :func:`room_counts` counts it; None when Redis could not be
    read (a watcher is told the room cannot be read, not that it is empty)."""
    allowed, blocked = yield from call(_entry, viewer, [room])
    if not allowed[0]:
        raise PermissionDenied(
            gettext("You may not enter the room %(room)s.") % {"room": room.name}
        )
    lookups = sorted(blocked, key=str)
    read = yield from redis(
        get_store().plans.read_room(room.name, resolution.now(), 0, lookups), live=True
    )
    return None if read is None else count_for(read, viewer_pk(viewer), blocked)


async def awatched_count(room: Room, viewer: Any) -> int | None:
    """The first answer of a ``watch_room_count``: see :func:`_watched_count`."""
    return await arun(_watched_count(room, viewer))


def _counts_for_viewers(
    viewers_by_room: dict[str, set[UserId]],
) -> Operation[dict[str, dict[UserId, int] | None]]:
    """Each room's count for each of its viewers: one trip to the database's thread (every
    viewer's blocks, one query) and one Redis round trip for every room (one per master), no
    member listed and no rule asked (the watchers were let in; presence.hub.room_counts asks
    again on its own pace). A room Redis could not read is None."""
    viewers = sorted({v for each in viewers_by_room.values() for v in each}, key=str)
    if not viewers_by_room:
        return {}
    blocks = yield from call(relations.blocks_between, viewers)
    lookups = sorted({u for users in blocks.values() for u in users}, key=str)
    rooms = list(viewers_by_room)
    now = resolution.now()
    store = get_store()
    reads = yield from redis(
        merge([store.plans.read_room(room, now, 0, lookups) for room in rooms]), live=True
    )
    counts: dict[str, dict[UserId, int] | None] = {}
    for room, read in zip(rooms, reads, strict=True):
        counts[room] = (
            None
            if read is None
            else {
                viewer: count_for(read, viewer, blocks.get(viewer, set()))
                for viewer in viewers_by_room[room]
            }
        )
    return counts


async def acounts_for_viewers(
    viewers_by_room: dict[str, set[UserId]],
) -> dict[str, dict[UserId, int] | None]:
    return await arun(_counts_for_viewers(viewers_by_room))
