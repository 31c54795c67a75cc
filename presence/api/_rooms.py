"""Rooms, read: who may enter a room (``ROOMS``'s rules) and who is in it as a viewer may see
it (:func:`room_presence`), through the one resolver.

A read costs O(ROOM_LIST_LIMIT + the viewer's contacts and blocks) whatever the room's size:
one query for the viewer's ties, one Redis script (the count, the first members by join time,
the viewer's contacts and blocks among the members, the invisible members), then the privacy
facts and live state of those candidates at once. Where the viewer may see fewer than
ROOM_LIST_LIMIT of them, the read goes four times further down the join order, up to the first
``WIDEST_FACTOR * ROOM_LIST_LIMIT``; members past that are listed only if they are the viewer's
contacts; the others count in ``others`` (docs/rooms.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.utils.module_loading import import_string
from django.utils.translation import gettext

from presence import relations, resolution
from presence.conf import get_settings
from presence.domain import UserId
from presence.domain.rooms import (
    Candidate,
    Member,
    Room,
    RoomState,
    is_counted,
    is_listed,
    order_listed,
    parse_room,
)
from presence.models import Block, Contact
from presence.operations import Call, Operation, Redis, arun, both, call, redis, run
from presence.store import StoreUnavailable, get_store
from presence.users import viewer_pk

logger = logging.getLogger("presence")

#: members read by join time for each listing, per member that may be listed
SCAN_FACTOR = 2
#: how far down the join order (times ROOM_LIST_LIMIT) a read goes for a viewer who may see
#: few of the first members
WIDEST_FACTOR = 32

RoomRule = Callable[[Any, str], Any]


class UnknownRoom(LookupError):
    """A room of a kind the site did not declare in ``ROOMS`` (404 over HTTP, ``unknown_room``
    over the WebSocket)."""

    code = "unknown_room"

    def __init__(self, room: Room) -> None:
        self.room = room
        self.message = gettext("There is no room of kind %(kind)s on this site.") % {
            "kind": repr(room.kind)
        }
        super().__init__(self.message)


def room_rule(room: Room) -> RoomRule | None:
    """The ``can_enter`` of the room's kind (None: any authenticated user enters);
    :class:`UnknownRoom` for a kind ``ROOMS`` does not declare. A path that does not import is
    refused like a rule that refuses (presence.E012 reports it)."""
    kinds = get_settings().ROOMS
    if room.kind not in kinds:
        raise UnknownRoom(room)
    path = kinds[room.kind]
    if path is None:
        return None
    rule: RoomRule = path if callable(path) else import_string(path)
    return rule


def may_enter(user: Any, room: Room) -> bool:
    """Whether ``user`` may enter ``room``: authenticated, of a declared kind (else
    :class:`UnknownRoom`), and let in by the kind's rule. A rule that raises refuses, and the
    error is logged."""
    rule = room_rule(room)
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    if rule is None:
        return True
    try:
        return bool(rule(user, room.id))
    except Exception:
        logger.exception("Presence: the rule of room kind %r raised for %s", room.kind, room)
        return False


async def amay_enter(user: Any, room: Room) -> bool:
    room_rule(room)  # UnknownRoom without a thread hop
    return await sync_to_async(may_enter)(user, room)


def viewer_ties(viewer_id: Any) -> tuple[set[UserId], set[UserId]]:
    """The viewer's contacts (listed first) and the users a block stands between the viewer
    and either way (neither listed nor counted): two indexed queries."""
    contacts: set[UserId] = set(
        Contact.objects.filter(owner=viewer_id).values_list("contact_id", flat=True)
    )
    blocked: set[UserId] = set()
    for blocker, blocked_id in Block.objects.filter(
        Q(blocker=viewer_id) | Q(blocked=viewer_id)
    ).values_list("blocker_id", "blocked_id"):
        blocked.add(blocked_id if blocker == viewer_id else blocker)
    return contacts, blocked


def _room_state(
    room: Room, viewer: Any, strict: bool = False, waits: bool = False
) -> Operation[RoomState]:
    """``strict``: raise StoreUnavailable when Redis cannot be read (a join must not show the
    room empty); otherwise the room reads empty then, as get_presence reads offline. ``waits``:
    a socket's join, which waits for a busy Redis up to LIVE_SOCKET_TIMEOUT, as the join's own
    write did (a page waits SOCKET_TIMEOUT)."""
    conf = get_settings()
    viewer_id = viewer_pk(viewer)
    contacts, blocked = yield from call(viewer_ties, viewer_id)
    now = resolution.now()
    lookups = [viewer_id, *contacts, *blocked]
    first = SCAN_FACTOR * conf.ROOM_LIST_LIMIT
    while True:
        state = yield from _read_first(room, viewer, now, first, lookups, blocked, contacts, waits)
        if state is None:
            if strict:
                raise StoreUnavailable("Redis is unavailable: the room could not be read")
            return RoomState(room, {}, 0)  # Redis is unavailable: nobody can be told present
        result, scanned_all = state
        # Few of the first members are the viewer's to see: read further down the join order,
        # so that a fresh read lists whom a live view listing newcomers while it has room lists.
        if len(result.members) >= conf.ROOM_LIST_LIMIT or scanned_all or first >= _widest(conf):
            return result
        first *= 4


def _widest(conf: Any) -> int:
    """How far down the join order a read goes for a viewer who may see few members."""
    return WIDEST_FACTOR * conf.ROOM_LIST_LIMIT


def _read_first(
    room: Room,
    viewer: Any,
    now: float,
    first: int,
    lookups: list[UserId],
    blocked: set[UserId],
    contacts: set[UserId],
    waits: bool,
) -> Operation[tuple[RoomState, bool] | None]:
    """The room as ``viewer`` sees it from its first ``first`` members by join time and the
    looked-up users, and whether those were all its members; None when Redis is unavailable."""
    conf = get_settings()
    store = get_store()
    viewer_id = viewer_pk(viewer)
    read = yield from redis(store.read_room(room.name, now, first, lookups), waits)
    if read is None:
        return None
    # Neither listed nor counted: invisible members and members blocked either way.
    excluded = set(read.invisible | (blocked & read.found)) - {viewer_id}
    candidates = [uid for uid in read.members if uid not in excluded]
    facts, live = yield from both(
        Call(relations.load, (viewer, candidates), relations.aload),
        Redis(store.read(candidates), waits),
    )
    presences = resolution.resolve_all(facts, live, now)
    listable = []
    for uid in candidates:
        if uid not in facts:
            continue  # a user deleted since they joined: counted, never listed
        relation, choices = facts[uid]
        if not is_counted(relation, choices.invisible):
            # Went invisible since joining (the room learns it at its next announcement).
            excluded.add(uid)
        elif is_listed(relation, presences[uid]):
            entry = read.members[uid]
            listable.append(
                Candidate(uid, entry.joined_at, uid in contacts, is_self=relation.is_self)
            )
    listed = order_listed(listable, conf.ROOM_LIST_LIMIT)
    members = {uid: Member(read.members[uid].meta, presences[uid]) for uid in listed}
    count = max(read.present - len(excluded), len(members))
    scanned_all = read.present <= first
    return RoomState(room, members, count - len(members)), scanned_all


def room_state(room: Any, viewer: Any, *, strict: bool = False) -> RoomState:
    """:func:`room_presence` as a :class:`~presence.domain.rooms.RoomState` (ids as the
    site's pks), for the live side and the template tag. ``strict``: StoreUnavailable when
    Redis cannot be read (the JSON endpoint answers 503), instead of the room read empty."""
    name = parse_room(room)
    if not may_enter(viewer, name):
        raise PermissionDenied(gettext("You may not see who is in this room."))
    return run(_room_state(name, viewer, strict))


async def aroom_state(room: Any, viewer: Any, *, strict: bool = False) -> RoomState:
    name = parse_room(room)
    if not await amay_enter(viewer, name):
        raise PermissionDenied(gettext("You may not see who is in this room."))
    return await arun(_room_state(name, viewer, strict))


async def aread_room_state(
    room: Room, viewer: Any, *, strict: bool = False, live: bool = False
) -> RoomState:
    """The room as ``viewer`` sees it, without checking the room's rule (the caller did).
    ``strict``: StoreUnavailable when Redis cannot be read, instead of an empty room;
    ``live``: a socket's read, which waits for a busy Redis (LIVE_SOCKET_TIMEOUT)."""
    return await arun(_room_state(room, viewer, strict, live))


def room_presence(room: Any, viewer: Any) -> dict[str, Any]:
    """Who is in ``room`` (``"kind:id"`` or ``(kind, id)``) as ``viewer`` may see it:
    ``{"room", "members": {"ID": {"meta", "presence"}}, "others", "count"}``, JSON-ready.

    ``members`` lists the viewer and the members whose online status the viewer may see (at
    most ROOM_LIST_LIMIT: the viewer, their contacts, then by join time); ``others`` counts the
    members present but not listed; invisible members and members blocked either way are
    neither listed nor counted. Raises InvalidInput (``invalid_value``) for a malformed name,
    :class:`UnknownRoom` for a kind the site did not declare, PermissionDenied where the room's
    rule refuses (anonymous viewers included).

    While Redis is unavailable it never raises, as :func:`get_presence` (which reads users
    offline then): the room reads empty (no member, count 0), and a page renders. The JSON
    endpoint answers 503 and a WebSocket join ``unavailable`` instead (docs/rooms.md)."""
    return room_state(room, viewer).as_dict()


async def aroom_presence(room: Any, viewer: Any) -> dict[str, Any]:
    return (await aroom_state(room, viewer)).as_dict()
