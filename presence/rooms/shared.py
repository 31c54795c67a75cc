"""A room's first members as the last batch of joins resolved them, kept for the next.

When 3,000 sockets reconnect to a restarted process (a reconnect storm) or a live event's page
fills its room, each batch of joins of a room (presence.rooms.joins) resolved the room's first
members again: their privacy facts and relations to the joiners (three queries), their live
state (a round trip), the resolver for each (member, relation), their cards (a query) and
their JSON, though mostly nothing of them had changed since the batch before. Here the process
keeps, per room, kind of read and depth, what the last batch read and resolved of its first
members (their choices, live state, presences per relation, the strangers' listing, cards and
JSON), and the batches that follow use it where it provably is what reading them again would
give:

- the batch's own read of the room's first members (in the round trip of its writes, as every
  batch reads them) finds the same members with the same entries and invisible flags;
- it was made under the presence settings in force, at most :data:`MAX_AGE` seconds ago (a
  member's card, a name changed in the user table, is the one thing no stamp follows);
- the members with a change stamped since it was made, or a turn offline or a custom status's
  end falling due (the change stamps a resume proves with, presence.stamps.changed_since_plan),
  are read again; the batch then keeps what it holds anew.

A joiner's relation to each first member is still its own: only the members it has a tie with
(a contact either way, a block, a privacy exception naming it, any of them found among its
looked-up users; :meth:`SharedListing.tied`) are read for it, with its looked-up users as
before; every other first member is a stranger to it, resolved once for all. Last seen must not
be reciprocal (then a viewer's own choices count for every member: nothing is kept). The
room's count, its invisible members and whether a list is full are the batch's fresh read's.

A page's read of a room (presence.rooms.reading: the JSON endpoint, the template tag, a
socket's ``room_state``) shares the same way, more simply (:class:`KnownMembers`): what it read
of the members it had no tie with (their choices, live state and presence as a stranger sees
them) is kept per room, and the next read, by any viewer, takes from it the members who are no
tie of its own and have no change stamped since (proven in the round trip of its room read),
reading the rest as before. Its listing, order and count are its own, from its fresh read.

What a batch or a read keeps again after taking a listing is dated by that listing, not by its
own time, so nothing is used more than MAX_AGE after it was read, however often the room is
read or joined (a heartbeat moves a member's last seen without a change stamped).
"""

from __future__ import annotations

import threading
from collections.abc import Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed

from presence.domain import UserId

if TYPE_CHECKING:
    from presence.domain import Choices, LiveState, Presence, Relation
    from presence.domain.rooms import Member
    from presence.rooms.listing import Rank
    from presence.rooms.reading import RoomEntry
    from presence.store.plans.rooms import RoomRead

#: seconds a room's shared listing is used at most (a renamed member's card, which no change
#: stamp follows, shows in the next one)
MAX_AGE = 2.0
#: rooms (per kind and depth) a process keeps a listing of at most
MAX_ROOMS = 256
#: seconds in a UTC day (nothing made before midnight is used after it)
DAY = 86400

_generation = 0


def _bump(*, setting: str, **kwargs: object) -> None:
    global _generation
    if setting == "PRESENCE":
        _generation += 1  # a listing made under other settings (DEFAULT_PRIVACY, ...) is stale


setting_changed.connect(_bump)


def _fresh(made_at: float, generation: int, now: float) -> bool:
    """Whether what was made at ``made_at`` under that generation of the settings may be used
    at ``now``: at most MAX_AGE old, on the same UTC day (the approximate last seen turns at
    midnight, which no change stamp follows), under the settings in force."""
    if generation != _generation or not (0 <= now - made_at <= MAX_AGE):
        return False
    return made_at // DAY == now // DAY


@dataclass
class SharedListing:
    """What a batch read and resolved of a room's first members (``page``, its read): their
    ``choices`` and ``live`` state, their ``presences`` per relation, the ``strangers``'
    listing (in the listing order with their places) and the members a stranger may not count
    among them (``unseen``); ``carded``: each member's dict with its card as a frame showed it
    (with the member it shows), ``fragments`` their JSON (by key and the dict's id), and
    ``cards`` the cards of every user a frame of it showed."""

    page: RoomRead
    choices: dict[UserId, Choices]
    live: dict[UserId, LiveState]
    presences: dict[tuple[UserId, Relation], Presence]
    strangers: list[tuple[UserId, Member, Rank]]
    unseen: frozenset[UserId]
    made_at: float
    generation: int = field(default_factory=lambda: _generation)
    carded: dict[UserId, tuple[Member, dict[str, Any]]] = field(default_factory=dict)
    #: the cards frames showed, by member key (a card is the user's, whoever sees them)
    cards: dict[str, dict[str, Any]] = field(default_factory=dict)
    fragments: dict[tuple[str, int], str] = field(default_factory=dict)

    def same_page(self, read: RoomRead) -> bool:
        """Whether ``read`` (a fresh read of the same first members) finds them as they were."""
        members = self.page.members
        if read.members != members:
            return False
        return read.invisible.intersection(members) == self.page.invisible.intersection(members)

    def tied(self, entry: RoomEntry, viewer_id: UserId, found: Set[UserId]) -> set[UserId]:
        """The first members a joiner is tied to, whose relation to it must be read: those
        among its looked-up users found in the room (contacts, blocks, users who may show it
        more) and those with a privacy exception naming it. Every other one is a stranger to
        it."""
        tied = (set(found) | entry.excepting).intersection(self.page.members)
        tied.discard(viewer_id)
        return tied

    def card(self, uid: UserId, member: Member) -> dict[str, Any] | None:
        """The member's dict with its card, if a frame showed ``member`` so already."""
        kept = self.carded.get(uid)
        if kept is None or not (kept[0] is member or kept[0] == member):
            return None
        return kept[1]


class SharedListings:
    """One process's shared listings (its hub's join batches), by room, kind and depth."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, bool, int], SharedListing] = {}

    def get(self, room: str, indexed: bool, first: int, now: float) -> SharedListing | None:
        """The room's listing for reads of this kind and depth, unless too old or made under
        other settings (whether its members are unchanged is the batch's to prove)."""
        kept = self._kept.get((room, indexed, first))
        if kept is None:
            return None
        if not _fresh(kept.made_at, kept.generation, now):
            del self._kept[(room, indexed, first)]
            return None
        return kept

    def keep(self, room: str, indexed: bool, first: int, listing: SharedListing) -> None:
        key = (room, indexed, first)
        self._kept.pop(key, None)
        if len(self._kept) >= MAX_ROOMS:
            del self._kept[next(iter(self._kept))]  # the oldest kept
        self._kept[key] = listing

    def forget(self, room: str, indexed: bool, first: int) -> None:
        self._kept.pop((room, indexed, first), None)

    def __len__(self) -> int:
        return len(self._kept)


@dataclass(frozen=True)
class KnownMembers:
    """What a page's read of a room resolved of members it had no tie with, as of ``made_at``:
    each one's ``choices``, ``live`` state (none: it had none) and ``presences`` as a stranger
    sees them (none: not resolved, an invisible member's say)."""

    choices: dict[UserId, Choices]
    live: dict[UserId, LiveState]
    presences: dict[UserId, Presence]
    made_at: float
    generation: int = field(default_factory=lambda: _generation)


class KnownRooms:
    """One process's known members, by room, for its reads (from any thread)."""

    def __init__(self) -> None:
        self._kept: dict[str, KnownMembers] = {}
        self._lock = threading.Lock()

    def get(self, room: str, now: float) -> KnownMembers | None:
        """The room's known members, unless too old or made under other settings (which of
        them changed since is the read's to prove)."""
        with self._lock:
            kept = self._kept.get(room)
            if kept is None or now < kept.made_at:
                return None  # (kept by a read begun later: not this one's to drop)
            if not _fresh(kept.made_at, kept.generation, now):
                del self._kept[room]
                return None
            return kept

    def keep(self, room: str, known: KnownMembers) -> None:
        """Keep ``known`` for the room, unless a read begun later kept its own already."""
        with self._lock:
            kept = self._kept.get(room)
            if kept is not None and kept.made_at > known.made_at:
                return
            self._kept.pop(room, None)
            if len(self._kept) >= MAX_ROOMS:
                del self._kept[next(iter(self._kept))]  # the oldest kept
            self._kept[room] = known

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    def __len__(self) -> int:
        return len(self._kept)


#: the process's known members of rooms, for its reads (presence.rooms.reading)
KNOWN = KnownRooms()
