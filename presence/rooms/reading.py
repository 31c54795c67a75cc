"""Rooms, read: who is in a room as a viewer may see it (:func:`room_presence`), through the
one resolver, once the room's rule (presence.rooms.rule) let the viewer in.

A read costs O(ROOM_LIST_LIMIT + the viewer's ties) whatever the room's size: one trip to the
database's thread (the room's rule and the viewer's ties, :func:`room_entry`), one Redis script
(the count, the first members by join time, the users looked up, the invisible members), then
the privacy facts and live state of those candidates at once.

The candidates are the members the viewer may be shown online, chosen by indexes: the room's
first *public* members by join time (those whose online status is shown to everyone; the room
keeps the segments holding them, presence.store.plans.rooms), and, looked up by id, the
viewer's contacts (listed first), the users who have the viewer among their contacts or an
"always share" exception for the viewer, and the users a block stands between. Nobody else may
be shown online to the viewer, so a stranger's read of a room whose members keep the default
privacy reads no candidate at all. Each candidate still goes through the one resolver: the
indexes only choose whom to ask about. Where the listing is not full yet, the read goes four
times further down the public members, up to the first ``WIDEST_FACTOR * ROOM_LIST_LIMIT``
(``others`` counts the rest, docs/rooms.md). A viewer looked up by more users than that (a
celebrity among many members' contacts) is read as before the indexes: down the whole join
order, to the same depth. Each candidate's facts and live state are read once however far the
read goes, in pieces (presence.rooms.candidates); a socket's join is charged by how many that
was.

A socket's join (:func:`ajoin_room_state`) writes and reads in one round trip: the join
script, the room's read and the joiner's own live state in one pipeline, after one trip to the
database's thread that also read the joiner's own facts (so a room of the joiner alone needs
no second trip).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import connections, router
from django.utils.translation import gettext

from presence import announce, outbox, relations, resolution, stamps
from presence.conf import STAMP_SLACK, get_settings
from presence.domain import SELF, STRANGER, Choices, LiveState, Presence, UserId, Visibility
from presence.domain.rooms import (
    Room,
    RoomState,
    parse_room,
)
from presence.operations import Call, Operation, Redis, arun, both, redis, redis_then, run
from presence.relations.facts import reciprocal
from presence.rooms.candidates import Resolved, read_candidates
from presence.rooms.cursors import with_next
from presence.rooms.listing import listable, listed_state
from presence.rooms.rule import may_enter, room_rule
from presence.rooms.shared import KNOWN, KnownMembers
from presence.store import Plan, StoreUnavailable, get_store, merge
from presence.store.plans.rooms import RoomRead, RoomWrite
from presence.users import viewer_pk

logger = logging.getLogger("presence")

#: members read by join time for each listing, per member that may be listed
SCAN_FACTOR = 2
#: how far down the join order (times ROOM_LIST_LIMIT) a read goes for a viewer who may see
#: few of the first members
WIDEST_FACTOR = 32


@dataclass(frozen=True)
class RoomEntry:
    """What a viewer's read of a room needs from the database, read in one trip to its thread
    (:func:`room_entry`): whether the room's rule lets the viewer in, the viewer's ties and,
    for a join, the viewer's own facts (a joiner is among the members it reads)."""

    allowed: bool
    contacts: set[UserId] = field(default_factory=set)
    blocked: set[UserId] = field(default_factory=set)
    #: the viewer's own facts (relation SELF, their choices); empty unless asked for
    own: relations.Facts = field(default_factory=dict)
    #: the users who may show the viewer their online status beyond "everyone"
    #: (relations.Ties); None: not read (the read goes down every member's join order)
    admitting: set[UserId] | None = None
    #: the owners of any privacy exception naming the viewer (relations.Ties): a viewer with
    #: none among a room's first members sees them as a stranger does (presence.rooms.shared)
    excepting: set[UserId] = field(default_factory=set)

    def invisible(self, viewer_id: UserId) -> bool:
        """Whether the viewer chose to be invisible (from their own facts)."""
        facts = self.own.get(viewer_id)
        return facts is not None and facts[1].invisible

    def public(self, viewer_id: UserId) -> bool:
        """Whether the viewer shows their online status to everyone (from their own facts;
        True where they were not read: a public member is only a candidate to others)."""
        facts = self.own.get(viewer_id)
        return facts is None or facts[1].online_visibility is Visibility.EVERYONE

    @property
    def indexed(self) -> bool:
        """Whether the read goes through the room's index of public members, the users who
        may show the viewer more looked up by id; else (looked up by too many users) down the
        whole join order, as before the index."""
        return self.admitting is not None and len(self.admitting) <= _widest(get_settings())


def room_entry(viewer: Any, room: Room | None, own: bool = False) -> RoomEntry:
    """:func:`may_enter` (unless ``room`` is None: the caller checked), then the viewer's ties
    and, with ``own``, their own facts: one trip to the database's thread for all of it.
    UnknownRoom for a kind ``ROOMS`` does not declare."""
    if room is not None and not may_enter(viewer, room):
        return RoomEntry(False)
    viewer_id = viewer_pk(viewer)
    ties = relations.viewer_ties(viewer_id)
    mine = relations.load(viewer, [viewer_id]) if own and viewer_id is not None else {}
    return RoomEntry(True, ties.contacts, ties.blocked, mine, ties.admitting, ties.excepting)


def room_entries(room: Room, viewers: list[Any], own: bool) -> list[RoomEntry | BaseException]:
    """:func:`room_entry` of each viewer (a batch of a room's joins, presence.rooms.joins):
    the rule asked for each (its failure for one is that one's answer), the ties and own
    facts of all in a few queries."""
    allowed: dict[int, bool | BaseException] = {}
    for viewer in viewers:
        try:
            allowed[id(viewer)] = may_enter(viewer, room)
        except Exception as failure:  # the site's rule failing for one user
            allowed[id(viewer)] = failure
    ids = [viewer_pk(viewer) for viewer in viewers if allowed[id(viewer)] is True]
    ties = relations.ties_of(ids)
    # Each joiner's own facts (relation SELF), as room_entry reads them one by one.
    mine = relations.load(None, ids) if own and ids else {}
    found: list[RoomEntry | BaseException] = []
    for viewer in viewers:
        verdict = allowed[id(viewer)]
        if verdict is not True:
            found.append(verdict if isinstance(verdict, BaseException) else RoomEntry(False))
            continue
        viewer_id = viewer_pk(viewer)
        contacts, blocked, admitting, excepting = ties[viewer_id]
        facts = mine.get(viewer_id)
        own_facts = {viewer_id: (SELF, facts[1])} if facts is not None else {}
        found.append(RoomEntry(True, contacts, blocked, own_facts, admitting, excepting))
    return found


async def aroom_entry(viewer: Any, room: Room | None, own: bool = False) -> RoomEntry:
    if room is not None:
        room_rule(room)  # UnknownRoom without a thread hop
    return await sync_to_async(room_entry)(viewer, room, own)


def _room_state(
    room: Room,
    viewer: Any,
    strict: bool = False,
    waits: bool = False,
    check: bool = True,
) -> Operation[RoomState]:
    """``strict``: raise StoreUnavailable when Redis cannot be read (a join must not show the
    room empty); otherwise the room reads empty then, as get_presence reads offline. ``waits``:
    a socket's read, which waits for a busy Redis up to LIVE_SOCKET_TIMEOUT (a page waits
    SOCKET_TIMEOUT). ``check``: the room's rule is asked in the same trip to the database's
    thread as the viewer's ties (PermissionDenied where it refuses)."""
    now = resolution.now()
    # The room's first public members and the viewer, read while the database's thread asks
    # the rule and reads the viewer's ties: what most viewers' read is (entry.indexed); the
    # users the ties name are looked up after, and the rest is read as before otherwise.
    viewer_id = viewer_pk(viewer)
    first = get_settings().ROOM_LIST_LIMIT
    mine = [viewer_id] if viewer_id is not None else []  # (an anonymous viewer is refused)
    guess = get_store().plans.read_room(room.name, now, first, mine, True)  # its public ones
    entry_step = Call(room_entry, (viewer, room if check else None))
    # What an earlier read of the room resolved of members it had no tie with, proven in
    # the same round trip: which of them have a change stamped since (presence.rooms.shared).
    sharing = viewer_id is not None and not reciprocal() and not _in_snapshot()
    known = KNOWN.get(room.name, now) if sharing else None
    changed: set[UserId] | None = None  # (None: what is known is not proven, not taken)
    if known is None:
        entry, read = yield from both(entry_step, Redis(guess, waits))
    else:
        proof = stamps.changed_since_plan(
            list(known.choices), viewer_id, known.made_at, now + STAMP_SLACK
        )
        entry, (read, kinds) = yield from both(entry_step, Redis(merge([guess, proof]), waits))
        changed = None if kinds is None else set(kinds)
    if not entry.allowed:
        raise PermissionDenied(gettext("You may not see who is in this room."))
    resolved = Resolved.of(entry.own)
    # Only an indexed read knows every user who may show the viewer more than a stranger.
    lookups = _read_plan_lookups(viewer, entry)
    ties = {*lookups, *entry.excepting} if entry.indexed else None
    if ties is not None and known is not None and changed is not None:
        _known_to(resolved, known, ties | changed)
    if entry.indexed and read is not None:
        looked_up = [uid for uid in lookups if uid != viewer_id]
        if looked_up:
            more = yield from redis(
                get_store().plans.read_room(room.name, now, 0, looked_up), waits
            )
            read = None if more is None else _with_found(read, more)
        state = None
        if read is not None:
            state = yield from _listing(room, viewer, now, first, read, entry, resolved, waits)
    else:
        first = _first(entry)
        state = yield from _read_first(room, viewer, now, first, entry, resolved, waits)
    if state is None:
        if strict:
            raise StoreUnavailable("Redis is unavailable: the room could not be read")
        return RoomState(room, {}, 0)  # Redis is unavailable: nobody can be told present
    result = yield from _widened(room, viewer, now, first, entry, resolved, waits, *state, strict)
    if sharing and ties is not None and resolved.read:
        # (members read afresh: kept with the others, proven unchanged as of now)
        proven = known if changed is not None else None
        _keep_known(room, resolved, ties, now, proven, changed or set())
    return result


def _in_snapshot() -> bool:
    """Whether this thread reads the users' database inside a transaction (ATOMIC_REQUESTS, a
    view's atomic block), which may show it as it was when the transaction began: what such a
    read resolved is not the state as of its time, and what is known is not that snapshot's
    either, so the read neither takes nor keeps."""
    return connections[router.db_for_read(get_user_model())].in_atomic_block


def _known_to(resolved: Resolved, known: KnownMembers, ties: set[UserId]) -> None:
    """What ``known`` holds of members but ``ties`` (the viewer's ties and the members
    changed since), as the viewer sees them: a stranger's view, proven unchanged."""
    for uid, choices in known.choices.items():
        if uid in ties or uid in resolved.asked:
            continue
        resolved.facts[uid] = (STRANGER, choices)
        live = known.live.get(uid)
        if live is not None:
            resolved.live[uid] = live
        presence = known.presences.get(uid)
        if presence is not None:
            resolved.presences[uid] = presence
        resolved.asked.add(uid)


def _keep_known(
    room: Room,
    resolved: Resolved,
    ties: set[UserId],
    now: float,
    proven: KnownMembers | None,
    changed: set[UserId],
) -> None:
    """Keep for the next reads what this one resolved of the members it read that are no tie
    of the viewer's (strangers to it), and what ``proven`` (the known members this read took,
    proven unchanged but ``changed``) holds of the others: as of ``now`` (before any of it was
    read), or of when ``proven`` was made if it was used, so that nothing is kept longer than
    MAX_AGE however often the room is read (a heartbeat, which stamps no change, moves a
    member's last seen; the approximate last seen turns at midnight)."""
    if resolved.live_unread:
        return  # some read offline for want of Redis: not what they are
    choices: dict[UserId, Choices] = {}
    live: dict[UserId, LiveState] = {}
    presences: dict[UserId, Presence] = {}
    for uid, facts in resolved.facts.items():
        if uid in ties or facts[0] != STRANGER:
            continue
        choices[uid] = facts[1]
        if uid in resolved.live:
            live[uid] = resolved.live[uid]
        if uid in resolved.presences:
            presences[uid] = resolved.presences[uid]
    if proven is not None:
        for uid, member_choices in proven.choices.items():
            if uid in choices or uid in changed:
                continue
            choices[uid] = member_choices
            if uid in proven.live:
                live[uid] = proven.live[uid]
            if uid in proven.presences:
                presences[uid] = proven.presences[uid]
    made_at = now if proven is None else proven.made_at
    KNOWN.keep(room.name, KnownMembers(choices, live, presences, made_at))


def _widened(
    room: Room,
    viewer: Any,
    now: float,
    first: int,
    entry: RoomEntry,
    resolved: Resolved,
    waits: bool,
    result: RoomState,
    more: bool,
    read_to: float,
    strict: bool,
) -> Operation[RoomState]:
    """``result``, read from the room's first ``first`` members (public ones, where
    ``entry.indexed``) up to the join time ``read_to``; where the listing may still take
    members further down (``more``), read further down the join order, so that a fresh read
    lists whom a live view listing newcomers while it has room lists."""
    conf = get_settings()
    while more and (further := wider(first, conf.ROOM_LIST_LIMIT)) is not None:
        first = further
        state = yield from _read_first(room, viewer, now, first, entry, resolved, waits)
        if state is None:
            if strict:
                raise StoreUnavailable("Redis is unavailable: the room could not be read")
            return RoomState(room, {}, 0)
        result, more, read_to = state
    if strict and resolved.live_unread:
        # Its members would read offline, and be left out of the list: nothing is guessed.
        raise StoreUnavailable("Redis is unavailable: the room's members could not be read")
    # Paging: no next page where the read found every member this viewer may be listed.
    complete = not more and len(result.members) < conf.ROOM_LIST_LIMIT
    return with_next(result, viewer_pk(viewer), complete, read_to)


def _widest(conf: Any) -> int:
    """How far down the join order a read goes for a viewer who may see few members."""
    return WIDEST_FACTOR * conf.ROOM_LIST_LIMIT


def wider(first: int, limit: int) -> int | None:
    """The next reach of a read that widens down the join order (four times as far, up to
    ``WIDEST_FACTOR * limit``); None once it reached the widest."""
    widest = WIDEST_FACTOR * limit
    return None if first >= widest else min(first * 4, widest)


def _lookups(viewer: Any, entry: RoomEntry) -> list[UserId]:
    """The users a read down every member's join order looks up: the viewer, their contacts
    and blocks (presence.rooms.paging's pages)."""
    return [viewer_pk(viewer), *entry.contacts, *entry.blocked]


def _first(entry: RoomEntry) -> int:
    """The members a read takes by join time at first: the public ones are mostly the
    viewer's to see (ROOM_LIST_LIMIT of them), any member may not be (twice as many)."""
    limit = get_settings().ROOM_LIST_LIMIT
    return limit if entry.indexed else SCAN_FACTOR * limit


def _read_plan(
    room: Room, viewer: Any, now: float, first: int, entry: RoomEntry
) -> Plan[RoomRead | None]:
    """The room's read for ``viewer``: its first ``first`` public members by join time and
    the users who may show the viewer more (``entry.indexed``), else its first ``first``
    members; the viewer, their contacts and blocks looked up either way."""
    looked_up = _read_plan_lookups(viewer, entry)
    return get_store().plans.read_room(room.name, now, first, looked_up, entry.indexed)


def _read_plan_lookups(viewer: Any, entry: RoomEntry) -> list[UserId]:
    """The users :func:`_read_plan` looks up."""
    looked_up = _lookups(viewer, entry)
    if entry.indexed and entry.admitting:
        looked_up += entry.admitting
    return looked_up


def _with_found(read: RoomRead, more: RoomRead) -> RoomRead:
    """``read`` (the first members by join time) with the looked-up users ``more`` found, as
    one read looking them up would have it."""
    members = dict(read.members)
    for uid in more.found:
        members.setdefault(uid, more.members[uid])
    return replace(read, members=members, found=read.found | more.found)


def _read_first(
    room: Room,
    viewer: Any,
    now: float,
    first: int,
    entry: RoomEntry,
    resolved: Resolved,
    waits: bool,
) -> Operation[tuple[RoomState, bool, float] | None]:
    """The room as ``viewer`` sees it from its first ``first`` members by join time and the
    looked-up users, whether reading further down could list more, and the join time its read
    reached (:func:`_listing`); None when Redis is unavailable."""
    read = yield from redis(_read_plan(room, viewer, now, first, entry), waits)
    if read is None:
        return None
    return (yield from _listing(room, viewer, now, first, read, entry, resolved, waits))


def _listing(
    room: Room,
    viewer: Any,
    now: float,
    first: int,
    read: RoomRead,
    entry: RoomEntry,
    resolved: Resolved,
    waits: bool,
) -> Operation[tuple[RoomState, bool, float]]:
    """The room as ``viewer`` sees it from ``read``, whether reading further down could list
    more, by the privacy facts and live state of its candidates (those ``resolved`` holds
    already, from the viewer's entry or an earlier pass of this read, are not read again),
    and the join time its read by join time reached (infinite: the whole room; the members
    it lists from further down were looked up by a tie, presence.rooms.cursors)."""
    conf = get_settings()
    viewer_id = viewer_pk(viewer)
    # Neither listed nor counted: invisible members and members blocked either way.
    excluded = set(read.invisible | (entry.blocked & read.found)) - {viewer_id}
    candidates = [uid for uid in read.members if uid not in excluded]
    facts, presences = resolved.facts, resolved.presences
    unread = [uid for uid in candidates if uid not in resolved.asked]
    yield from read_candidates(viewer, unread, resolved, waits)
    fresh = {uid: facts[uid] for uid in candidates if uid in facts and uid not in presences}
    presences.update(resolution.resolve_all(fresh, resolved.live, now))
    found = listable(
        read.members, excluded, entry.contacts, facts.get, lambda uid, _: presences[uid]
    )
    state = listed_state(room, found, conf.ROOM_LIST_LIMIT, read.present, excluded)
    more = not (read.complete or _full(dict(state.ranks), viewer_id, read.horizon))
    return state, more, _read_to(read)


def _read_to(read: RoomRead) -> float:
    """The join time a read by join time reached: the whole room's where it read to the end."""
    if read.complete:
        return math.inf
    return -math.inf if read.horizon is None else read.horizon


def _full(ranks: dict[UserId, tuple[bool, float, str]], viewer_id: UserId, horizon: Any) -> bool:
    """Whether ROOM_LIST_LIMIT listed members come before any member further down the join
    order than ``horizon`` (the join time of the last read by join time): the viewer, their
    contacts (all looked up) and those who joined no later. Members further down are not the
    viewer's contacts and joined at ``horizon`` or later, so none could take a place (members
    who joined in the same millisecond are taken in the room's order, as a read down the join
    order takes them)."""
    ahead = (True, horizon if horizon is not None else -1.0, "\uffff")
    before = sum(1 for uid, r in ranks.items() if uid == viewer_id or r <= ahead)
    return before >= get_settings().ROOM_LIST_LIMIT


async def ajoin_room_state(
    room: Room,
    user: Any,
    connection_id: str,
    meta: str | None,
    invisible: bool,
    entry: RoomEntry,
    public: bool = True,
) -> tuple[RoomState, int]:
    """A socket's join (the caller asked the room's rule, :func:`aroom_entry` with ``own``):
    the connection joins ``room`` (joining again replaces its meta), announced to the room when
    what others see changed, and the room as ``user`` sees it now, with how many members' facts
    its read resolved (what the join is charged). The join script, the room's read and the
    joiner's live state go in one round trip (the read runs after the write, in the same
    pipeline: the joiner is among the members it reads). StoreUnavailable when Redis cannot be
    written or read: nothing is guessed. ``public``: the joiner shows their online status to
    everyone (the room's index of public members holds them)."""
    store = get_store()
    user_id = viewer_pk(user)
    now = resolution.now()
    first = _first(entry)
    plans: list[Plan[Any]] = [
        store.plans.join_room(
            room.name, user_id, connection_id, now, meta, invisible, public=public
        ),
        _read_plan(room, user, now, first, entry),
        store.plans.read_recent([user_id], 0),
    ]
    # The user entering the room is sent as room_entered (presence.outbox), even if the
    # caller is cancelled meanwhile.
    replies = await arun(redis_then(merge(plans), outbox.send_made, live=True))
    write: RoomWrite | None = replies[0]
    read: RoomRead | None = replies[1]
    if write is None or read is None:
        raise StoreUnavailable("Redis is unavailable: the join was not written or read")
    announcing = None
    if write.changed:
        # On its way while the joiner's view is resolved; never raises.
        announcing = asyncio.ensure_future(announce.aannounce_room(room.name, [user_id]))
    resolved = Resolved.of(entry.own, replies[2])
    try:
        listing = await arun(_listing(room, user, now, first, read, entry, resolved, True))
        state = await arun(_widened(room, user, now, first, entry, resolved, True, *listing, True))
        return state, resolved.read
    finally:
        if announcing is not None:
            await asyncio.shield(announcing)


def room_state(room: Any, viewer: Any, *, strict: bool = False) -> RoomState:
    """:func:`room_presence` as a :class:`~presence.domain.rooms.RoomState` (ids as the
    site's pks), for the live side and the template tag. ``strict``: StoreUnavailable when
    Redis cannot be read (the JSON endpoint answers 503), instead of the room read empty."""
    name = parse_room(room)
    room_rule(name)  # UnknownRoom first, as may_enter raises it
    return run(_room_state(name, viewer, strict))


async def aroom_state(room: Any, viewer: Any, *, strict: bool = False) -> RoomState:
    name = parse_room(room)
    room_rule(name)
    return await arun(_room_state(name, viewer, strict))


async def aread_room_state(
    room: Room, viewer: Any, *, strict: bool = False, live: bool = False
) -> RoomState:
    """The room as ``viewer`` sees it, without checking the room's rule (the caller did).
    ``strict``: StoreUnavailable when Redis cannot be read, instead of an empty room;
    ``live``: a socket's read, which waits for a busy Redis (LIVE_SOCKET_TIMEOUT)."""
    return await arun(_room_state(room, viewer, strict, live, check=False))


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
