"""Rooms, paged: the next members of a room after a cursor (docs/rooms.md, "Paging"), as the
viewer may see them, through the same reading path as the room's state.

A room's state lists its first ROOM_LIST_LIMIT members the viewer may see, in the state's
order (presence.domain.rooms.order_listed: the viewer, their contacts, then by join time, ties
by id as text), and carries ``next``: the cursor after them (presence.rooms.cursors). A page
is the next ROOM_LIST_LIMIT of them after a cursor, with the cursor after it (None once no
member is left to list). The page is read as the state is: the room's rule and the viewer's
ties in one trip to the database's thread, one Redis script (the count, the members who joined
from the cursor's millisecond on, found by bisection of the room's segments, the viewer's
contacts and blocks, the invisible members), then the privacy facts and live state of the
candidates after the cursor (presence.rooms.candidates), listed by the one resolver
(presence.rooms.reading). Where the viewer may see few of them the read goes four times
further, up to ``WIDEST_FACTOR * ROOM_LIST_LIMIT`` members past the cursor, as a first read
does; a page that lists fewer than ROOM_LIST_LIMIT members (even none) but did not reach the
room's end still has a ``next``, past the members it read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.core.exceptions import PermissionDenied
from django.utils.translation import gettext

from presence import resolution
from presence.conf import get_settings
from presence.domain import UserId
from presence.domain.rooms import Room, RoomState, parse_room
from presence.operations import Operation, arun, call, redis, run
from presence.rooms.candidates import Resolved
from presence.rooms.cursors import (
    PHASE_CONTACT,
    PHASE_OTHER,
    PHASE_SELF,
    Cursor,
    Place,
    encoded,
    place_of,
)
from presence.rooms.cursors import decode as decode_cursor
from presence.rooms.reading import SCAN_FACTOR, RoomEntry, _listing, _lookups, room_entry, wider
from presence.rooms.rule import room_rule
from presence.store import StoreUnavailable, get_store
from presence.store.plans.rooms import RoomPage, RoomRead
from presence.users import viewer_pk


def _page(
    room: Room, viewer: Any, after: Cursor, waits: bool, check: bool = True
) -> Operation[tuple[RoomState, int]]:
    """The page after ``after`` as ``viewer`` sees it, and how many members' facts its read
    resolved (what a socket's page is charged). PermissionDenied where the room's rule
    refuses (``check``: asked in the same trip as the viewer's ties); StoreUnavailable when
    Redis cannot be read (a page is never shown empty for an outage)."""
    entry = yield from call(room_entry, viewer, room if check else None)
    if not entry.allowed:
        raise PermissionDenied(gettext("You may not see who is in this room."))
    limit = get_settings().ROOM_LIST_LIMIT
    now = resolution.now()
    viewer_id = viewer_pk(viewer)
    resolved = Resolved.of(entry.own)
    # Past the viewer and their contacts, the page starts at the cursor's millisecond.
    start = after.place[1] if after.place[0] == PHASE_OTHER else None
    lookups = _lookups(viewer, entry)
    first = SCAN_FACTOR * limit
    while True:
        page = yield from redis(
            get_store().plans.read_room_page(room.name, now, first, start, lookups), waits
        )
        if page is None:
            raise StoreUnavailable("Redis is unavailable: the room could not be read")
        read, end, done = _after(page, after, entry, viewer_id, first)
        state, _, _ = yield from _listing(room, viewer, now, first, read, entry, resolved, waits)
        if resolved.live_unread:
            raise StoreUnavailable("Redis is unavailable: the room's members could not be read")
        further = wider(first, limit)
        if len(state.members) >= limit or done or further is None:
            break
        first = further
    if len(state.members) >= limit:
        last = max(place_of(uid, state.ranks[uid], viewer_id) for uid in state.members)
        cursor: Cursor | None = after.following(last)
    else:
        # Every member it read that the viewer may see is listed: the next page starts past
        # them (a viewer who may see few reads on from there).
        cursor = None if done or end is None else after.following(end)
    return replace(state, next=encoded(room, cursor)), resolved.read


def _after(
    page: RoomPage, after: Cursor, entry: RoomEntry, viewer_id: UserId | None, first: int
) -> tuple[RoomRead, Place | None, bool]:
    """The read of ``page`` with only its members after the cursor (at most ``first``, in
    the state's order), where the part it read ends, and whether it read to the room's end."""
    read = page.read

    def place(uid: UserId) -> Place:
        phase = (
            PHASE_SELF
            if uid == viewer_id
            else PHASE_CONTACT
            if uid in entry.contacts
            else PHASE_OTHER
        )
        return (phase, read.members[uid].joined_at, str(uid))

    # The viewer and their contacts are looked up wherever they are; the others are the
    # page's (the looked-up users past it are not: its end is where it stopped reading).
    # Members never listed nor counted (invisible, a block between them) take no place on a
    # page: where a page ends never tells of them.
    uncounted = (read.invisible | entry.blocked) - {viewer_id}
    places = {uid: place(uid) for uid in read.members}
    passing = sorted(
        (places[uid], uid)
        for uid in read.members
        if (uid in page.page or places[uid][0] != PHASE_OTHER)
        and uid not in uncounted
        and after.passes(places[uid])
    )
    kept = passing[:first]
    trimmed = len(passing) > first
    if trimmed:
        end: Place | None = kept[-1][0]
    elif page.page:
        # The script returns whole milliseconds: this one was read to its last member.
        end = (PHASE_OTHER, max(read.members[uid].joined_at for uid in page.page) + 1, "")
    else:
        end = None
    members = {uid: read.members[uid] for _, uid in kept}
    return replace(read, members=members), end, page.done and not trimmed


def room_page_state(room: Any, viewer: Any, after: Any) -> RoomState:
    """:func:`room_page` as a RoomState (ids as the site's pks)."""
    name = parse_room(room)
    room_rule(name)
    cursor = decode_cursor(name, after)
    return run(_page(name, viewer, cursor, waits=False))[0]


def room_page(room: Any, viewer: Any, after: Any) -> dict[str, Any]:
    """The members of ``room`` after the cursor ``after`` (the ``next`` of an answer about
    the room) as ``viewer`` may see them, JSON-ready as :func:`room_presence`'s state:
    ``{"room", "members", "others", "count", "next"}``, ``members`` the next ROOM_LIST_LIMIT
    at most, in the state's order, and ``next`` the following page's cursor (None at the
    end). InvalidInput (``invalid_value``) for a malformed name or a cursor this server did
    not give for the room; UnknownRoom; PermissionDenied where the rule refuses;
    StoreUnavailable while Redis cannot be read (a page is never shown empty for an
    outage)."""
    return room_page_state(room, viewer, after).as_dict()


async def aroom_page(room: Any, viewer: Any, after: Any) -> dict[str, Any]:
    name = parse_room(room)
    room_rule(name)
    cursor = decode_cursor(name, after)
    return (await arun(_page(name, viewer, cursor, waits=False)))[0].as_dict()


async def aread_room_page(
    room: Room, viewer: Any, after: Any, *, check: bool = True
) -> tuple[RoomState, int]:
    """A socket's page (it waits for a busy Redis), and how many members' facts its read
    resolved (what it is charged)."""
    room_rule(room)
    cursor = decode_cursor(room, after)
    return await arun(_page(room, viewer, cursor, waits=True, check=check))
