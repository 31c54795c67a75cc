"""Rooms, joined together: the joins of one room that this process's sockets make at about the
same time, written and read as one (a live event: a thousand sockets joining the room its page
opens, on the process that also holds the room's viewers).

One socket's join is one read of the room for its own ``room_state`` (presence.rooms.reading):
a thousand joins were a thousand reads of the same first members, each with the privacy facts
and live state of its candidates, one trip to the database's thread each. Here the joins that
arrive while the room's previous batch is under way wait for it, then go together
(:class:`JoinBatches`; a join alone goes at once, as before, through
:func:`~presence.rooms.reading.ajoin_room_state`). A batch (:func:`ajoin_many`) is:

- one Redis round trip: every join script, the room's first members by join time once per
  kind (its public ones, through its index, for joiners read so alone), and the joiners'
  looked-up users (each joiner, their contacts, blocks and who may show them more) once;
- then at once: the candidates' facts with their relations to every joiner (three queries,
  ``relations.load_pairs``) and their live state (one script);
- each (candidate, relation) resolved once, by the one resolver, for every joiner: a joiner
  with no tie to any candidate (most of them) shares the strangers' listing, plus itself;
- one announcement, "these users joined the room".

Each joiner is answered exactly what its own read would have listed and counted (the one
listing rule of presence.rooms.listing, which a read applies too): a joiner who may see fewer
than ROOM_LIST_LIMIT of the first members has its read go further down the join order, alone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async

from presence import announce, domain, outbox, relations, resolution, stamps
from presence.conf import STAMP_SLACK, get_settings
from presence.domain import UserId
from presence.domain.rooms import (
    Candidate,
    Member,
    Room,
    RoomState,
    order_listed,
)
from presence.operations import arun
from presence.relations.facts import reciprocal
from presence.rooms.batches import Batches
from presence.rooms.candidates import Resolved
from presence.rooms.cards import add_cards
from presence.rooms.cursors import with_next
from presence.rooms.listing import Rank, listable, listed_state, rank
from presence.rooms.reading import (
    SCAN_FACTOR,
    RoomEntry,
    _full,
    _lookups,
    _read_to,
    _widened,
    ajoin_room_state,
    room_entries,
    room_entry,
)
from presence.rooms.rule import room_rule
from presence.rooms.shared import SharedListing, SharedListings
from presence.store import Plan, StoreUnavailable, get_store, merge
from presence.store.plans.rooms import MemberEntry, RoomRead, RoomWrite
from presence.users import viewer_pk

#: joins of one room written and read together at most (the next ones go in the next batch)
MAX_BATCH = 1000


@dataclass(frozen=True)
class Joining:
    """One socket's join, as :func:`~presence.rooms.reading.ajoin_room_state` takes it."""

    user: Any
    connection_id: str
    meta: str | None
    invisible: bool
    entry: RoomEntry
    #: the user shows their online status to everyone (the rooms' index of public members)
    public: bool = True
    #: when the join was asked (its joined time): the joins of a batch keep their own moments,
    #: not one for all (a read takes the members of one millisecond together, so a thousand
    #: joins dated alike would be read, and resolved, by every read of the room after them)
    at: float = field(default_factory=resolution.now)


#: what a join of a batch is answered: its room_state, how many members' facts were read for
#: it (what it is charged), and its ``room_state`` frame (the listed members' cards in it) as
#: a dict and as the JSON text to send
Answer = tuple[RoomState, int, dict[str, Any], str]


class JoinBatches:
    """The process's joins, batched per room: the database's part of a join (the room's rule,
    the joiner's ties and own facts), then its write and read, each done once for all the
    joins of the room made meanwhile."""

    def __init__(self, gather: Callable[[], Awaitable[None]] | None = None) -> None:
        # ``gather``: awaited before each batch of a room's entries, the joins arriving
        # meanwhile going with it (the hub's: presence.admission.gather_while_waiting); their
        # writes and reads then go together too.
        self._entries: Batches[Any, RoomEntry] = Batches(_entries, MAX_BATCH, gather)
        #: each room's first members as strangers see them, for the next batches
        self.shared = SharedListings()
        self._joins: Batches[Joining, Answer] = Batches(partial(_joins, self.shared), MAX_BATCH)

    async def entry(self, viewer: Any, room: Room, own: bool) -> RoomEntry:
        """:func:`~presence.rooms.reading.aroom_entry`: one trip to the database's thread for
        the joins of the room made meanwhile."""
        room_rule(room)  # UnknownRoom without a thread hop
        return await self._entries.submit((room, own), viewer)

    async def join(self, room: Room, joining: Joining) -> Answer:
        """Write ``joining`` and read the room for it, with the joins of the room made
        meanwhile. StoreUnavailable when Redis cannot be written or read."""
        return await self._joins.submit(room, joining, undo_after_run=True)


async def _entries(key: tuple[Room, bool], viewers: list[Any]) -> list[RoomEntry | BaseException]:
    """:func:`~presence.rooms.reading.room_entry` of each viewer, in one trip to the
    database's thread: the rule asked for each, the ties and own facts of all in a few
    queries."""
    room, own = key
    if len(viewers) == 1:
        return [await sync_to_async(room_entry)(viewers[0], room, own)]

    return await sync_to_async(room_entries)(room, viewers, own)


async def _joins(
    shared: SharedListings, room: Room, joins: list[Joining]
) -> list[Answer | BaseException]:
    served: dict[int, SharedListing] = {}
    answers = await ajoin_many(room, joins, shared, served)
    # The frames, each listed member's dict made once for every frame listing it, and the
    # cards of all of them read at once (presence.rooms.cards); the members of a shared
    # listing with the cards and JSON its first frame gave them (presence.rooms.shared).
    encoded: dict[int, dict[str, Any]] = {}
    frames: list[dict[str, Any]] = []
    fragments: dict[tuple[str, int], str] = {}
    known: dict[str, dict[str, Any]] = {}
    for listing in {id(listing): listing for listing in served.values()}.values():
        fragments.update(listing.fragments)
        known.update(listing.cards)
    for n, answer in enumerate(answers):
        if isinstance(answer, BaseException):
            continue
        state = answer[0]
        kept = served.get(n)
        members = {}
        for uid, member in state.members.items():
            found = None if kept is None else kept.card(uid, member)
            if found is None:
                found = encoded.get(id(member))
                if found is None:
                    found = encoded[id(member)] = member.as_dict()
            members[str(uid)] = found
        frames.append(
            {
                "type": "room_state",
                "room": state.room.name,
                "members": members,
                "others": state.others,
                "count": state.count,
                "next": state.next,
            }
        )
    await add_cards([frame["members"] for frame in frames], known)
    framed = iter(frames)
    answered: list[Answer | BaseException] = []
    for n, answer in enumerate(answers):
        if isinstance(answer, BaseException):
            answered.append(answer)
            continue
        frame = next(framed)
        answered.append((*answer, frame, frame_text(frame, fragments)))
        kept = served.get(n)
        if kept is not None:
            _keep_cards(kept, answer[0], frame["members"], fragments, viewer_pk(joins[n].user))
    return answered


def _keep_cards(
    kept: SharedListing,
    state: RoomState,
    members: dict[str, dict[str, Any]],
    fragments: dict[tuple[str, int], str],
    viewer_id: UserId,
) -> None:
    """Keep with a shared listing the first members' dicts with their cards and their JSON as a
    frame showed them (each with the member it shows: a later frame showing the member alike
    uses them; the joiner's own entry, as it sees itself, is not kept)."""
    for uid, member in state.members.items():
        key = str(uid)
        carded = members[key]
        if "card" in carded:
            kept.cards.setdefault(key, carded["card"])
        if uid == viewer_id or uid in kept.carded or uid not in kept.page.members:
            continue
        kept.carded[uid] = (member, carded)
        text = fragments.get((key, id(carded)))
        if text is not None:
            kept.fragments[(key, id(carded))] = text


def frame_text(frame: dict[str, Any], fragments: dict[tuple[str, int], str]) -> str:
    """``frame`` (a room_state) as JSON, the text ``json.dumps`` makes of it, each member's
    part (its id and dict) made once for every frame of the batch listing it (``fragments``,
    by the id and the member dict's id: add_cards keeps one dict per member shown alike; the
    frames hold them all while ``fragments`` is used, so no id is reused)."""
    members = []
    for key, member in frame["members"].items():
        text = fragments.get((key, id(member)))
        if text is None:
            text = fragments[(key, id(member))] = f"{_dumps(key)}:{_dumps(member)}"
        members.append(text)
    return (
        f'{{"type":"room_state","room":{_dumps(frame["room"])},"members":{{{",".join(members)}}},'
        f'"others":{frame["others"]:d},"count":{frame["count"]:d},"next":{_dumps(frame["next"])}}}'
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


async def ajoin_many(
    room: Room,
    joins: Sequence[Joining],
    shared: SharedListings | None = None,
    served: dict[int, SharedListing] | None = None,
) -> list[tuple[RoomState, int] | BaseException]:
    """Each join written, announced, and answered its room_state (see the module's doc).
    StoreUnavailable when Redis cannot be written or read: nothing is guessed. ``shared``: the
    process's shared listings (presence.rooms.shared), used and kept where last seen is not
    reciprocal (a join alone then goes as a batch of one, so that it uses and makes them too);
    ``served`` is told which joins were answered from which."""
    sharing = shared is not None and not reciprocal()
    if len(joins) == 1 and not sharing:
        one = joins[0]
        return [
            await ajoin_room_state(
                room, one.user, one.connection_id, one.meta, one.invisible, one.entry, one.public
            )
        ]
    store = get_store()
    now = resolution.now()
    limit = get_settings().ROOM_LIST_LIMIT
    # Each joiner's read as its own would be (reading._read_plan): the first public members
    # (and the users who may show it more, looked up) where its entry is indexed, else the
    # first members of all; each kind read once for the batch.
    lookups = {id(joining): _looked_up(joining) for joining in joins}
    everyone = list(dict.fromkeys(uid for each in lookups.values() for uid in each))
    kinds = sorted({joining.entry.indexed for joining in joins})
    plans: list[Plan[Any]] = [
        store.plans.join_room(
            room.name,
            viewer_pk(joining.user),
            joining.connection_id,
            now,
            joining.meta,
            joining.invisible,
            public=joining.public,
            joined_at=joining.at,
        )
        for joining in joins
    ]
    # The first members alone, then the looked-up users alone: which of the members are
    # the first ones is every joiner's (of its kind), which are looked up only those who
    # looked them up.
    plans += [
        store.plans.read_room(room.name, now, _first_of(indexed, limit), (), indexed)
        for indexed in kinds
    ]
    plans.append(store.plans.read_room(room.name, now, 0, everyone))
    # A shared listing of a kind is proven in the same round trip: which of its members have a
    # change stamped (or a turn offline due) since it was made; the batch's page read is
    # compared with its own after.
    kept: dict[bool, SharedListing] = {}
    if sharing and shared is not None:
        for indexed in kinds:
            listing = shared.get(room.name, indexed, _first_of(indexed, limit), now)
            if listing is not None:
                kept[indexed] = listing
    probe = viewer_pk(joins[0].user)
    proofs = [
        stamps.changed_since_plan(listing.page.members, probe, listing.made_at, now + STAMP_SLACK)
        for listing in kept.values()
    ]
    replies = await store.arun(merge([*plans, *proofs]), live=True)
    if replies is not None:
        # Each user who entered the room is sent room_entered (presence.outbox).
        outbox.send_made(replies[: len(joins)])
    if replies is None or any(reply is None for reply in replies[: len(plans)]):
        raise StoreUnavailable("Redis is unavailable: the joins were not written or read")
    writes: list[RoomWrite] = replies[: len(joins)]
    pages: dict[bool, RoomRead] = dict(
        zip(kinds, replies[len(joins) : len(joins) + len(kinds)], strict=True)
    )
    looked_up: RoomRead = replies[len(plans) - 1]
    valid: dict[bool, tuple[SharedListing, set[UserId]]] = {}
    if kept and shared is not None:
        proven = replies[len(plans) :]
        for (indexed, listing), since in zip(kept.items(), proven, strict=True):
            # The members who may have changed since it was made are read again (a member who
            # has not reconnected yet in a storm has its turn offline due about then).
            if since is not None and listing.same_page(pages[indexed]):
                valid[indexed] = (listing, set(since))
            else:
                shared.forget(room.name, indexed, _first_of(indexed, limit))
    changed = [viewer_pk(j.user) for j, write in zip(joins, writes, strict=True) if write.changed]
    announcing = asyncio.ensure_future(announce.aannounce_room(room.name, changed))
    try:
        return await _answers(
            room,
            joins,
            now,
            pages,
            looked_up,
            lookups,
            _Shared(shared if sharing else None, valid, served),
        )
    finally:
        await asyncio.shield(announcing)


@dataclass
class _Shared:
    """A batch's shared listings: the process's (None: not shared here), those proven
    unchanged by the batch's read, and the listing of each join's kind (to be told)."""

    listings: SharedListings | None = None
    #: by kind of read: the listing, and its members who may have changed since (read again)
    valid: dict[bool, tuple[SharedListing, set[UserId]]] = field(default_factory=dict)
    served: dict[int, SharedListing] | None = None


def _looked_up(joining: Joining) -> list[UserId]:
    """The users a joiner's read looks up (reading._read_plan)."""
    entry = joining.entry
    admitting = entry.admitting if entry.indexed and entry.admitting else ()
    return [*_lookups(joining.user, entry), *admitting]


def _first_of(indexed: bool, limit: int) -> int:
    """The members a read takes by join time at first (reading._first)."""
    return limit if indexed else SCAN_FACTOR * limit


async def _answers(
    room: Room,
    joins: Sequence[Joining],
    now: float,
    pages: dict[bool, RoomRead],
    looked_up: RoomRead,
    lookups: dict[int, list[UserId]],
    shared: _Shared | None = None,
) -> list[tuple[RoomState, int] | BaseException]:
    shared = shared or _Shared()
    store = get_store()
    conf = get_settings()
    limit = conf.ROOM_LIST_LIMIT
    viewers = list(dict.fromkeys(viewer_pk(joining.user) for joining in joins))
    # What is read for the joiners: the first members of their kind, but those a shared
    # listing holds that a joiner has no tie with; and their looked-up users found.
    targets: dict[UserId, None] = {}
    for _, changed in shared.valid.values():
        targets.update(dict.fromkeys(changed))
    for joining in joins:
        found = looked_up.found.intersection(lookups[id(joining)])
        valid = shared.valid.get(joining.entry.indexed)
        if valid is None:
            targets.update(dict.fromkeys(pages[joining.entry.indexed].members))
        else:
            tied = valid[0].tied(joining.entry, viewer_pk(joining.user), found)
            targets.update(dict.fromkeys(tied))
        targets.update(dict.fromkeys(found))
    # A joiner alone: its own choices were read with its entry, not read again. (With other
    # joiners, its relations to them are read with its facts: one may be another's contact.)
    own: dict[UserId, domain.Choices] = {}
    if len(viewers) == 1:
        own = {uid: facts[1] for joining in joins for uid, facts in joining.entry.own.items()}
    pairs, live = await asyncio.gather(
        relations.aload_pairs(viewers, [uid for uid in targets if uid not in own]),
        store.arun(store.plans.read_recent(list(targets), 0), live=True),
    )
    if live is None:
        raise StoreUnavailable("Redis is unavailable: the room's members could not be read")
    for uid, choices in own.items():
        if uid in targets:
            pairs.choices.setdefault(uid, choices)
    for kept, _ in shared.valid.values():
        # Proven unchanged: what was read of the other first members is theirs now.
        for uid, choices in kept.choices.items():
            if uid not in targets:
                pairs.choices[uid] = choices
        for uid, live_state in kept.live.items():
            if uid not in targets:
                live[uid] = live_state
    listings: dict[bool, _Listing] = {}
    for indexed in pages:
        listing = listings[indexed] = _Listing(
            pages[indexed], pairs, live, now, _first_of(indexed, limit)
        )
        valid = shared.valid.get(indexed)
        made: SharedListing | None = None
        stale: set[UserId] = set()
        if valid is not None:
            made, stale = valid
            listing.reuse(made, stale)
        if shared.listings is not None and (made is None or stale):
            # What the next batches are answered from, while it holds (its members who may
            # have changed read again: it holds as of now).
            # (as of when the listing used was made, if one was: nothing is kept past
            # MAX_AGE however often the room's joins come)
            made = listing.keep(now if made is None else made.made_at)
            shared.listings.keep(room.name, indexed, listing.first, made)
        if made is not None and shared.served is not None:
            for n, joining in enumerate(joins):
                if joining.entry.indexed == indexed:
                    shared.served[n] = made
    answers: list[tuple[RoomState, int] | BaseException] = []
    for joining in joins:
        viewer_id = viewer_pk(joining.user)
        indexed = joining.entry.indexed
        page, listing = pages[indexed], listings[indexed]
        found = looked_up.found.intersection(lookups[id(joining)])
        members = dict(page.members)
        for uid in found:
            members.setdefault(uid, looked_up.members[uid])
        read = RoomRead(page.present, members, found, page.invisible, page.complete)
        state, scanned_all = listing.state(room, viewer_id, read, joining.entry)
        charged = len(members) - (viewer_id in joining.entry.own)
        # (the rule of reading._widened: done unless a member further down could be listed)
        if scanned_all or _full(dict(state.ranks), viewer_id, page.horizon):
            complete = scanned_all and len(state.members) < limit
            answers.append((with_next(state, viewer_id, complete, _read_to(page)), charged))
            continue
        # Few of the first members are this joiner's to see: its read goes further, alone,
        # from what the batch read for it.
        resolved = Resolved(listing.facts_for(viewer_id, members), dict(live), set(members))
        resolved.read = charged
        try:
            wider = await arun(
                _widened(
                    room,
                    joining.user,
                    now,
                    listing.first,
                    joining.entry,
                    resolved,
                    True,
                    state,
                    True,  # more may be listed further down
                    _read_to(page),
                    True,
                )
            )
            answers.append((wider, resolved.read))
        except Exception as failure:
            answers.append(failure)
    return answers


class _Listing:
    """The room as each joiner of a batch sees it, from the batch's reads: the one listing
    rule (presence.rooms.listing), with each (member, relation) resolved once."""

    def __init__(
        self,
        page: RoomRead,
        pairs: relations.PairFacts,
        live: dict[UserId, domain.LiveState],
        now: float,
        first: int,
    ) -> None:
        self.pairs, self.live, self.now, self.first = pairs, live, now, first
        self.timing = resolution.timing()
        self._presences: dict[tuple[UserId, domain.Relation], domain.Presence] = {}
        # The first members as a stranger sees them, once for every joiner with no tie to any
        # of them (with reciprocity every viewer's own choices count: no viewer is a stranger).
        self._strangers = pairs.viewer_choices is None
        self._tied = {viewer for _, viewer in pairs.contacts}
        self._tied.update(viewer for _, viewer in pairs.exceptions)
        self._tied.update(uid for pair in pairs.blocks for uid in pair)
        self._page = page
        self._shared: tuple[list[tuple[UserId, Member, Rank]], set[UserId]] | None = None

    def reuse(self, kept: SharedListing, stale: set[UserId]) -> None:
        """Start from what a shared listing resolved of the same first members, proven
        unchanged but for ``stale`` (presence.rooms.shared, read again): their presences per
        relation and, with none stale, the strangers' listing (whom a stranger may not count:
        the fresh read's invisible members too)."""
        for key, presence in kept.presences.items():
            if key[0] not in stale:
                self._presences.setdefault(key, presence)
        if not stale:
            self._shared = (kept.strangers, set(self._page.invisible) | kept.unseen)

    def keep(self, now: float) -> SharedListing:
        """What this batch read and resolved of its first members, for the next batches
        (presence.rooms.shared): made before any joiner's own members are resolved."""
        strangers, unseen = self._stranger_listing()
        members = self._page.members
        return SharedListing(
            self._page,
            {uid: choices for uid, choices in self.pairs.choices.items() if uid in members},
            {uid: state for uid, state in self.live.items() if uid in members},
            {key: found for key, found in self._presences.items() if key[0] in members},
            strangers,
            frozenset(unseen.intersection(members)),
            now,
        )

    def presence(self, uid: UserId, relation: domain.Relation) -> domain.Presence:
        key = (uid, relation)
        found = self._presences.get(key)
        if found is None:
            found = self._presences[key] = domain.resolve(
                self.live.get(uid, domain.LiveState()),
                self.pairs.choices[uid],
                relation,
                self.now,
                self.timing,
            )
        return found

    def facts_for(self, viewer_id: UserId, members: dict[UserId, MemberEntry]) -> relations.Facts:
        choices = self.pairs.choices
        return {
            uid: (self.pairs.relation(viewer_id, uid), choices[uid])
            for uid in members
            if uid in choices
        }

    def _pass(
        self,
        viewer_id: UserId,
        members: dict[UserId, MemberEntry],
        excluded: set[UserId],
        contacts: set[UserId],
    ) -> list[tuple[Candidate, Member]]:
        """The members ``viewer_id`` may list, as it would see them (the one listing rule,
        presence.rooms.listing); those it may not count are added to ``excluded``."""
        choices, relation = self.pairs.choices, self.pairs.relation

        def facts_of(uid: UserId) -> tuple[domain.Relation, domain.Choices] | None:
            return (relation(viewer_id, uid), choices[uid]) if uid in choices else None

        return listable(members, excluded, contacts, facts_of, self.presence)

    def _stranger_listing(self) -> tuple[list[tuple[UserId, Member, Rank]], set[UserId]]:
        """The first members a stranger may list, in the listing order with their places, and
        those a stranger does not count."""
        if self._shared is None:
            excluded = set(self._page.invisible)
            # None of the first members is this viewer: an id no user has.
            found = self._pass(_NOBODY, self._page.members, excluded, set())
            order = {
                uid: n for n, uid in enumerate(order_listed([c for c, _ in found], len(found)))
            }
            found.sort(key=lambda item: order[item[0].user_id])
            shared = [(c.user_id, m, rank(c.contact, c.joined_at, c.user_id)) for c, m in found]
            self._shared = (shared, excluded)
        return self._shared

    def state(
        self, room: Room, viewer_id: UserId, read: RoomRead, entry: RoomEntry
    ) -> tuple[RoomState, bool]:
        """``viewer_id``'s room_state from ``read`` (the first members and its looked-up
        users), and whether that read all the room's members."""
        limit = get_settings().ROOM_LIST_LIMIT
        excluded = set(read.invisible | (entry.blocked & read.found)) - {viewer_id}
        members: dict[UserId, Member] = {}
        ranks: dict[UserId, Rank] = {}
        if self._strangers and viewer_id not in self._tied and read.found <= {viewer_id}:
            # No contact, block or exception between the joiner and any member read: the
            # joiner itself (order_listed puts the viewer first), then the strangers' listing.
            shared, shared_excluded = self._stranger_listing()
            excluded = (shared_excluded | excluded) - {viewer_id}
            own = {viewer_id: read.members[viewer_id]} if viewer_id in read.members else {}
            for c, member in self._pass(viewer_id, own, excluded, set())[:limit]:
                members[c.user_id] = member
                ranks[c.user_id] = rank(c.contact, c.joined_at, c.user_id)
            for uid, member, place in shared:
                if len(members) >= limit:
                    break
                if uid != viewer_id:
                    members[uid] = member
                    ranks[uid] = place
        else:
            found = self._pass(viewer_id, read.members, excluded, entry.contacts)
            state = listed_state(room, found, limit, read.present, excluded)
            members, ranks = dict(state.members), dict(state.ranks)
        count = max(read.present - len(excluded), len(members))
        # every member read (an indexed read: every public one, the rest looked up)
        scanned_all = read.complete or read.present <= self.first
        return RoomState(room, members, count - len(members), ranks), scanned_all


class _Nobody:
    """An id equal to no user's (the strangers' shared listing is resolved as by nobody)."""

    def __repr__(self) -> str:
        return "<nobody>"


_NOBODY: Any = _Nobody()
