"""Rooms, live: the delta of a room's changed users that the hub turns into ``room_diff``
frames (:func:`aroom_delta`).

How a big room's fan-out stays O(changes), not O(members²), per coalescing window
(presence.hub.rooms): announcements carry only "these users changed in room R". Once per room
per window, the process reads what it needs *about the changed users only*: one Redis script
(the count, the changed users' entries, the invisible members, the viewers' blocked users
present) and the changed users' choices. The count is ``present - invisible - blocked for this
viewer``: set lookups, O(1) per viewer, no privacy resolved. Pairs are resolved only for the
viewers that could list a changed user (``resolving``): those listing one of them, or whose
list has room. A viewer whose list is full and lists none of them (most viewers of a big
room in a burst of joins) gets only its count: the changed users rank after its listed
members (they are not listed ahead of them by a fresh read either; a changed user who joined
earlier than a full list's last member is resolved in a second delta: presence.hub.rooms).
For the viewers resolved, the pair facts come in three queries and the resolver runs once per
(user, relation), so most viewers share it. A burst of 1,000 joins is one read and about one
frame per viewer per window.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from presence import domain, relations, resolution
from presence.conf import get_settings
from presence.domain import UserId
from presence.domain.rooms import Member, Room, is_counted, is_listed
from presence.operations import Call, Operation, Redis, arun, both, redis
from presence.store import get_store
from presence.store.plans.rooms import MemberEntry


@dataclass
class RoomDelta:
    """What changed users look like in a room now, for many viewers (see the module's doc)."""

    room: Room
    #: members present now, invisible ones included
    present: int
    #: the changed users present now, by join time, with their entries
    members: dict[UserId, MemberEntry]
    #: invisible members present now (the room's flags: a changed user who chose to be
    #: invisible since is not listed, and counted until the flag is written)
    invisible: set[UserId]
    #: each viewer's users present with a block either way between them
    blocked: dict[UserId, set[UserId]]
    pairs: relations.PairFacts
    live: dict[UserId, domain.LiveState]
    now: float
    #: (viewer, user) pairs with a contact row either way or a block: the others are strangers
    ties: set[tuple[UserId, UserId]] = field(default_factory=set)
    #: viewers with a tie to one of the changed users
    tied_viewers: set[UserId] = field(default_factory=set)
    #: the viewers whose pair facts were read: only they may be resolved (see member_for)
    resolving: frozenset[UserId] = frozenset()
    #: the first members by join time that are not changed (a refill's candidates), with
    #: their entries; empty unless a refill was asked for
    scanned: dict[UserId, MemberEntry] = field(default_factory=dict)
    #: a refill's contacts present of the viewers in ``contacts`` (wherever they joined), past
    #: ``scanned``: each viewer's own are its candidates, never another's
    looked_up: dict[UserId, MemberEntry] = field(default_factory=dict)
    #: whether ``scanned`` reached the room's last member (a refill reads no further)
    scan_complete: bool = True
    #: each viewer's contacts among the changed users; for a refill, every contact of the
    #: viewers whose lists hold only contacts (their next member may be a contact who joined
    #: anywhere in the room)
    contacts: dict[UserId, set[UserId]] = field(default_factory=dict)
    _verdicts: dict[tuple[UserId, domain.Relation], Member | None] = field(default_factory=dict)
    _as_stranger: dict[UserId, Member | None] = field(default_factory=dict)
    _strangers_list: list[tuple[UserId, Member]] | None = None
    _encoded: dict[int, dict[str, Any]] = field(default_factory=dict)

    def count_for(self, viewer: UserId) -> int:
        """Members counted for ``viewer``: O(their blocks)."""
        invisible = len(self.invisible) - (viewer in self.invisible)
        blocked = len(self.blocked.get(viewer, set()) - self.invisible)
        return max(self.present - invisible - blocked, 0)

    def member_for(self, viewer: UserId, user_id: UserId) -> Member | None:
        """The changed user as ``viewer`` may list them, or None (absent, not counted, or
        hidden from the viewer): the one resolver, once per (user, relation) whatever the
        number of viewers (most of them are strangers to most members). Only for a viewer
        whose pair facts were read (any other would be taken for a stranger), or the viewer
        itself."""
        if viewer not in self.resolving and viewer != user_id:
            # (The viewer itself is SELF whatever the pairs: its own choices were read with
            # the changed users'.)
            raise ValueError(f"viewer {viewer!r} was not resolved in this delta")
        if (
            viewer != user_id
            and self.pairs.viewer_choices is None
            and ((viewer, user_id) not in self.ties)
        ):
            if user_id not in self._as_stranger:
                self._as_stranger[user_id] = self._verdict(user_id, domain.STRANGER)
            return self._as_stranger[user_id]
        relation = self.pairs.relation(viewer, user_id)
        key = (user_id, relation)
        if key not in self._verdicts:
            self._verdicts[key] = self._verdict(user_id, relation)
        return self._verdicts[key]

    def listable(self, viewer: UserId) -> list[tuple[UserId, Member]]:
        """The changed users ``viewer`` may list, by join time: for a viewer with no tie to
        any of them (most viewers), one list shared by all such viewers."""
        if (
            viewer not in self.tied_viewers
            and viewer not in self.members
            and self.pairs.viewer_choices is None
        ):
            if self._strangers_list is None:
                self._strangers_list = [
                    (uid, member)
                    for uid in self.members
                    if (member := self.member_for(viewer, uid)) is not None
                ]
            return self._strangers_list
        return [
            (uid, member)
            for uid in self.members
            if (member := self.member_for(viewer, uid)) is not None
        ]

    def refill(self, viewer: UserId) -> list[tuple[UserId, float, Member]]:
        """The scanned members ``viewer`` may list (and its own contacts looked up), with their
        join times: what a fresh read would list next when a place in a full list was freed."""
        found = []
        mine = self.contacts.get(viewer, set())
        own = [(uid, entry) for uid, entry in self.looked_up.items() if uid in mine]
        for uid, entry in [*self.scanned.items(), *own]:
            member = self.member_for(viewer, uid)
            if member is not None:
                found.append((uid, entry.joined_at, member))
        return found

    def _verdict(self, user_id: UserId, relation: domain.Relation) -> Member | None:
        entry = (
            self.members.get(user_id) or self.scanned.get(user_id) or self.looked_up.get(user_id)
        )
        choices = self.pairs.choices.get(user_id)
        if entry is None or choices is None:
            return None
        if not is_counted(relation, user_id in self.invisible):
            return None
        presence = domain.resolve(
            self.live.get(user_id, domain.LiveState()),
            choices,
            relation,
            self.now,
            resolution.timing(),
        )
        return Member(entry.meta, presence) if is_listed(relation, presence) else None

    def encoded(self, member: Member) -> dict[str, Any]:
        """``member.as_dict()``, built once for every viewer it is sent to."""
        found = self._encoded.get(id(member))
        if found is None:
            found = self._encoded[id(member)] = member.as_dict()
        return found


def _blocks_and_pairs(
    viewers: Collection[UserId], resolved: Collection[UserId], changed: Collection[UserId]
) -> tuple[dict[UserId, set[UserId]], dict[UserId, set[UserId]], list[UserId], relations.PairFacts]:
    """The viewers' blocks, their contacts among the changed users, the viewers resolved (those
    asked, and those with a contact among the changed users: a full list lists its contacts
    first), and the changed users' facts with their relations to those viewers (their choices
    only when none is): one trip to the database's thread."""
    contacts = relations.contacts_among(viewers, changed)
    asked = set(resolved)
    resolving = [viewer for viewer in viewers if viewer in asked or viewer in contacts]
    return (
        relations.blocks_between(viewers),
        contacts,
        resolving,
        relations.load_pairs(resolving, changed),
    )


def _lookups(changed: Collection[UserId], blocks: dict[UserId, set[UserId]]) -> list[UserId]:
    return list(dict.fromkeys([*changed, *(u for users in blocks.values() for u in users)]))


def _blocks_and_contacts(
    viewers: Collection[UserId], owners: Collection[UserId]
) -> tuple[dict[UserId, set[UserId]], dict[UserId, set[UserId]]]:
    """The viewers' blocks, and every contact of ``owners`` (a refill's): one trip."""
    return relations.blocks_between(viewers), relations.contacts_of(owners)


def _room_delta(
    room: Room,
    viewers: Collection[UserId],
    changed: Collection[UserId],
    resolving: Collection[UserId],
    scan: int,
    contacts_of: Collection[UserId] = (),
) -> Operation[RoomDelta | None]:
    store = get_store()
    asked = set(resolving)
    resolved_viewers = [viewer for viewer in viewers if viewer in asked]
    now = resolution.now()
    scanned: dict[UserId, MemberEntry] = {}
    looked_up: dict[UserId, MemberEntry] = {}
    scan_complete = True
    if not scan:
        # One trip to the database's thread (the viewers' blocks, the changed users' facts)
        # and one to Redis (the room, their live state): under a burst, each trip waits for
        # a busy thread and event loop, the most of a window's time.
        blocks, contacts, resolved_viewers, pairs = yield Call(
            _blocks_and_pairs, (list(viewers), resolved_viewers, list(changed))
        )
        lookups = _lookups(changed, blocks)
        read_plan = store.plans.read_room(room.name, now, 0, lookups)
        # The changed users' live state, for the viewers resolved and for each viewer that
        # is a changed user (it sees itself, SELF, whatever the pairs).
        if resolved_viewers or not set(viewers).isdisjoint(changed):
            read, live = yield from both(
                Redis(read_plan, live=True), Redis(store.plans.read(list(changed)), live=True)
            )
        else:
            read, live = (yield from redis(read_plan, live=True)), {}
        if read is None or live is None:
            return None
        present = [uid for uid in changed if uid in read.found]
    else:
        # A refill: the first members by join time are read first, then their facts too;
        # and, for a list of contacts only, the viewer's contacts wherever they joined.
        blocks, contacts = yield Call(_blocks_and_contacts, (list(viewers), list(contacts_of)))
        contact_ids = set().union(*contacts.values())
        lookups = _lookups([*changed, *contact_ids], blocks)
        read = yield from redis(store.plans.read_room(room.name, now, scan, lookups), live=True)
        if read is None:
            return None
        present = [uid for uid in changed if uid in read.found]
        # (a page cut at ``scan`` left members of its last millisecond unread)
        scan_complete = read.complete and len(read.members) <= scan
        changed_set = set(changed)
        scanned = {
            uid: entry
            for uid, entry in list(read.members.items())[:scan]
            if uid not in changed_set and uid not in read.invisible
        }
        looked_up = {
            uid: read.members[uid]
            for uid in contact_ids
            if uid in read.found
            and uid not in changed_set
            and uid not in read.invisible
            and uid not in scanned
        }
        targets = [*present, *scanned, *looked_up]
        pairs, live = yield from both(
            Call(relations.load_pairs, (resolved_viewers, targets), relations.aload_pairs),
            Redis(store.plans.read(targets), live=True),
        )
        if live is None:
            return None
    # Counted by the room's flags alone, as a fresh read and room_counts count: a member who
    # went invisible resolves offline (not listed) and is counted until their connections
    # write the flag (announced: within COALESCE_WINDOW) or, with none left, their stay ends.
    invisible = set(read.invisible)
    members = {uid: read.members[uid] for uid in present}
    # A contact row or an exception of the target's for the viewer, or a block: not a
    # stranger. (With reciprocity a viewer's own choices count too: no viewer is taken for a
    # plain stranger, see member_for.)
    ties = {(viewer, target) for target, viewer in pairs.contacts}
    ties.update((viewer, owner) for owner, viewer in pairs.exceptions)
    for pair in pairs.blocks:
        if len(pair) == 2:
            a, b = pair
            ties.update(((a, b), (b, a)))
    return RoomDelta(
        room=room,
        present=read.present,
        # by join time, ties by id: the listing order (presence.rooms.reading.rank)
        members=dict(sorted(members.items(), key=lambda item: (item[1].joined_at, str(item[0])))),
        invisible=invisible,
        blocked={viewer: users & read.found for viewer, users in blocks.items()},
        pairs=pairs,
        live=live,
        now=now,
        ties=ties,
        tied_viewers={viewer for viewer, _ in ties},
        resolving=frozenset(resolved_viewers),
        scanned=scanned,
        looked_up=looked_up,
        scan_complete=scan_complete,
        contacts=contacts,
    )


async def aroom_delta(
    room: Room,
    viewers: Collection[UserId],
    changed: Collection[UserId],
    resolving: Collection[UserId] | None = None,
    scan: int = 0,
    contacts_of: Collection[UserId] = (),
) -> RoomDelta | None:
    """The changed users of ``room`` as these viewers may see them, and each viewer's count
    (see :class:`RoomDelta`); None when Redis is unavailable (nothing is guessed). Pairs are
    resolved for the viewers in ``resolving`` only (default: all); ``scan`` > 0 also reads
    the first ``scan`` members by join time for them (a refill's candidates), and every
    contact present of the viewers in ``contacts_of``."""
    resolved = viewers if resolving is None else resolving
    return await arun(_room_delta(room, viewers, changed, resolved, scan, contacts_of))


def list_limit() -> int:
    return get_settings().ROOM_LIST_LIMIT
