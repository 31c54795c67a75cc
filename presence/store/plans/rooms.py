"""The plans of rooms: joining, leaving, renewing a connection's stay, reading a room, and
sweeping members whose stay ended. No I/O.

Every key of a room carries the room as its hash tag (one slot, :meth:`KeyScheme.room_key`), so
each write is one script there. A room's members are held in segments of at most 128 in join
order (the listing order), found by an index of small buckets that split as the room grows, and
counted by a summary (members recorded, minus the stays ended per second): every key stays a
listpack, about 50 B a member, whatever the room's size (lua/room_common.lua). Rooms due to be
swept sit in a schedule per shard (:meth:`KeyScheme.room_schedule_key`), claimed by the hubs'
sweeps like users' due times. Layout: docs/redis-layout.md.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from typing import Any, NamedTuple

from presence import domain
from presence.memo import BoundedMemo
from presence.store.keys import KeyScheme
from presence.store.plans.outbox import claim, outbox_deadline
from presence.store.plans.plan import RAISE, Plan, PlanArea, script_call
from presence.store.scripts import (
    ROOM_CLAIM,
    ROOM_COUNT,
    ROOM_JOIN,
    ROOM_LEAVE,
    ROOM_PAGE,
    ROOM_PRUNE,
    ROOM_READ,
    Script,
)
from presence.users import UserId, encode_id, id_decoder


class RoomTransition(NamedTuple):
    """A user entered a room (``made`` 1: its first connection in) or left it (-1: its stay
    ended, or it was refused) at ``at``: recorded in the room's outbox by the script that
    decided it (lua/room_common.lua), so exactly one caller on the site sends room_entered /
    room_left; ``entry`` None: claimed already (by the sweep that returned it). A tuple (a
    sweep makes one per member removed: cheap to build)."""

    room: str
    user_id: UserId
    made: int
    at: float
    entry: str | None = None


@dataclass(frozen=True)
class RoomWrite:
    """What a join or a leave changed: the user became a member (``joined``); what others are
    shown of the member changed (``changed``: a new member, its meta, its invisibility, or its
    public flag, which decides whose reads consider it: announced, so that a viewer who read
    the room before the flag was written resolves the member again)."""

    joined: bool
    changed: bool
    #: the transitions the write made, each to be claimed (presence.outbox)
    made: tuple[RoomTransition, ...] = field(default=(), compare=False)


class Pruned(NamedTuple):
    """What a room's sweep did (:meth:`RoomPlans.prune_room`)."""

    #: the members removed
    gone: list[UserId]
    #: the room's next due time (infinity: its keys are gone, its outbox empty; an entry in
    #: its outbox keeps it due, the batch of leaves just made too)
    due: float
    #: their leaves, each to be claimed, then the transitions left past their deadline,
    #: claimed by this sweep (presence.outbox)
    made: list[RoomTransition]
    #: this sweep removed the room's last member (its keys are gone, its outbox aside)
    emptied: bool = False


class MemberEntry(NamedTuple):
    """A member as the room holds it: when it joined (ms), whether it joined invisible, and
    the meta it shows (that of its connection that joined last). A tuple: a read makes one
    per member (a frozen dataclass cost three times as much to build)."""

    joined_at: float
    invisible: bool = False
    meta: str | None = None


@dataclass(frozen=True)
class RoomRead:
    """A room as Redis holds it, read in O(first + looked up) (:meth:`RoomPlans.read_room`)."""

    #: members present (their stay not ended), invisible ones included
    present: int
    #: the first members by join time, then the looked-up users present, with their entries
    members: dict[UserId, MemberEntry] = field(default_factory=dict)
    #: the looked-up users present (the viewer's contacts, blocks, ...)
    found: frozenset[UserId] = frozenset()
    #: invisible members present
    invisible: frozenset[UserId] = frozenset()
    #: whether the members read by join time were all there are (of those asked: all, or the
    #: public ones)
    complete: bool = False
    #: the join time (ms) of the last member read by join time (None: none was): members
    #: further down joined at it or later
    horizon: float | None = None


@dataclass(frozen=True)
class RoomPage:
    """A page of a room as Redis holds it (:meth:`RoomPlans.read_room_page`): ``read.members``
    holds the page's members (every member present who joined from the page's start up to its
    last millisecond, which it holds whole) and the looked-up users present; ``page`` the
    page's members, in no order; ``done``: the page reached the room's end."""

    read: RoomRead
    page: frozenset[UserId]
    done: bool


def _room_page(reply: list[Any]) -> RoomPage:
    decode = id_decoder()
    present, page, found, invisible, entries, done = reply
    shown = {
        member: (bool(int(inv)), _text(meta) if meta else None)
        for member, inv, meta in zip(entries[::3], entries[1::3], entries[2::3], strict=True)
    }
    members: dict[UserId, MemberEntry] = {}
    for flat in (page, found):
        for member, joined in zip(flat[::2], flat[1::2], strict=True):
            members[decode(member)] = MemberEntry(float(joined), *shown[member])
    read = RoomRead(
        present=max(int(present), 0),
        members=members,
        found=frozenset(decode(m) for m in found[::2]),
        invisible=frozenset(decode(m) for m in invisible),
    )
    return RoomPage(read, frozenset(decode(m) for m in page[::2]), bool(int(done)))


#: the room's per-second counts of stays ending: score = second * STAY_SHIFT + members
STAY_SHIFT = 2**21

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
#: every two-digit pair, so a number is written two digits a step
_PAIRS = [a + b for a in _DIGITS for b in _DIGITS]


def b36(n: int) -> str:
    """``n`` in base 36, as an entry holds it (lua/room_common.lua's b36): a join's and a
    leave's times are sent so, and the script writes them as they come."""
    if n <= 0:
        return "0"
    parts = []
    while n >= 1296:
        n, r = divmod(n, 1296)
        parts.append(_PAIRS[r])
    parts.append(_PAIRS[n] if n >= 36 else _DIGITS[n])
    return "".join(reversed(parts))


#: :func:`b36` of the seconds a stay ends at (every join of a second sends the same one)
_b36_seconds = BoundedMemo(b36, 256)


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else str(value)


def _transitions(room: str, entries: list[Any], claimed: bool = False) -> list[RoomTransition]:
    """The room's outbox entries as transitions (``claimed``: no entry left to claim); a
    batch's (a sweep's leaves, lua/outbox.lua ``record_batch``) share their entry, claimed
    once for them all."""
    decode = id_decoder()
    found: list[RoomTransition] = []
    for raw in entries:
        text = _text(raw)
        made, _, at, _, rest = text.split("|", 4)
        entry = None if claimed else text
        if at != "*":
            found.append(RoomTransition(room, decode(rest), int(made), float(at), entry))
            continue
        kind, parts, n = int(made), rest.split(":"), 0
        while n < len(parts):
            when, count = float(parts[n]), int(parts[n + 1])
            # (a sweep's thousand leaves: built in C, not one Python call each)
            uids = map(decode, parts[n + 2 : n + 2 + count])
            found += map(
                _transition, zip(repeat(room), uids, repeat(kind), repeat(when), repeat(entry))
            )
            n += 2 + count
    return found


#: a RoomTransition of its fields' tuple (tuple.__new__, without the NamedTuple's own __new__)
_transition = partial(tuple.__new__, RoomTransition)


def _room_write(room: str, joined: bool, changed: Any, made: Any) -> RoomWrite:
    """A join's or a leave's reply, with the transitions its script recorded in the outbox."""
    return RoomWrite(joined, bool(changed), tuple(_transitions(room, made)))


class RoomPlans(PlanArea):
    """The plans of rooms, over the key scheme."""

    def __init__(self, keys: KeyScheme) -> None:
        super().__init__(keys)
        #: each room's summary key and schedule key, built once (a join's plan is built for
        #: every join: the keys were a tenth of its time in the process)
        self._write_keys = BoundedMemo(self._room_write_keys, 4096)

    def _room_write_keys(self, room: str) -> tuple[str, str]:
        return self.keys.room_key(room, "n"), self.keys.room_schedule_key(room)

    def room_keys(self, room: str) -> list[str]:
        """The room's summary key (its scripts' KEYS[1]; they build the others in its slot)."""
        return [self._write_keys(room)[0]]

    def _stay_end(self, seconds: int) -> int:
        """A connection heard from now stays until then (its heartbeat's TTL, domain.offline_at)."""
        return seconds + domain.SECOND + self.conf.CONNECTION_TTL

    def join_room(
        self,
        room: str,
        user_id: UserId,
        connection_id: str,
        now: float,
        meta: str | None = None,
        invisible: bool = False,
        renew: bool = False,
        public: bool = True,
        joined_at: float | None = None,
    ) -> Plan[RoomWrite | None]:
        """A connection joins ``room`` with ``meta`` (compact JSON or None); ``joined_at``: when
        the join was asked, if before ``now`` (a batch's joins, each dated by its own); ``renew``: a
        heartbeat of a connection in the room, which keeps its place and meta (and joins it
        again if its stay ended meanwhile). ``public``: the user's online status may be shown
        to everyone (their level is "everyone"), so the member is in the room's index of the
        members a stranger's read considers (:meth:`read_room` ``public_only``); True where
        not known, which only makes the member a candidate (the resolver decides). The room is
        scheduled for its sweep first, so no key is ever left without a due time."""
        seconds = int(now)
        expiry = self._stay_end(seconds)
        # A join may make the user enter the room: its outbox entry, if its caller never
        # claims it, is the room's sweep's past the deadline (a renewal's rarely: its sweep's
        # at the stay's end).
        due = expiry if renew else min(expiry, seconds + math.ceil(outbox_deadline(self.conf)))
        args = [
            encode_id(user_id),
            connection_id,
            "beat" if renew else "join",
            seconds,
            _b36_seconds(expiry),
            b36(int((now if joined_at is None else min(joined_at, now)) * 1000)),
            meta or "",
            int(meta is not None),
            int(invisible),
            int(public),
        ]
        return self._scheduled(
            ROOM_JOIN,
            room,
            args,
            due,
            lambda reply: _room_write(room, bool(reply[0]), *reply[1:3]),
        )

    def _scheduled(
        self,
        script: Script,
        room: str,
        args: list[Any],
        due: int,
        parse: Callable[[Any], RoomWrite],
    ) -> Plan[RoomWrite | None]:
        """A write of the room (``parse`` reads its script's reply) with the room scheduled for
        its sweep at ``due`` or earlier, first: in the script on one Redis (one command: no
        pipeline of two); on a cluster (the schedule is another slot's) by a ZADD of its own,
        and the script only once it succeeded (a round trip later), so a room is never written
        unscheduled (the write then fails: None)."""
        summary, schedule = self._write_keys(room)
        if self.keys.clustered:
            return Plan(
                commands=[
                    ("ZADD", schedule, "LT", due, room),
                    script_call(script, (summary,), args),
                ],
                parse=lambda replies: parse(replies[1]),
                fallback=None,
                needs={1: 0},
            )
        return Plan(
            commands=[script_call(script, (summary, schedule), [*args, due, room])],
            parse=lambda replies: parse(replies[0]),
            fallback=None,
        )

    def leave_room(
        self, room: str, user_id: UserId, connection_id: str, now: float, at_once: bool = False
    ) -> Plan[RoomWrite | None]:
        """A connection leaves ``room``; the user stays for OFFLINE_GRACE if it was their last
        (a connection not in the room changes nothing). ``at_once``: no grace (the room's rule
        refused the user, or the user was deleted): unless another connection of theirs is in
        the room, they leave it now (their connections in their grace too), and reads and
        counts leave them out at once."""
        seconds = int(now)
        grace_end = seconds if at_once else seconds + domain.SECOND + self.conf.OFFLINE_GRACE
        args = [encode_id(user_id), connection_id, seconds, _b36_seconds(grace_end), int(at_once)]
        return self._scheduled(
            ROOM_LEAVE, room, args, grace_end, lambda reply: _room_write(room, False, *reply[0:2])
        )

    def read_room(
        self,
        room: str,
        now: float,
        first: int,
        lookups: list[UserId] | tuple[UserId, ...] = (),
        public_only: bool = False,
    ) -> Plan[RoomRead | None]:
        """The room's count, its first ``first`` members by join time (``public_only``: its
        first ``first`` public members, through the index of their segments) and which of
        ``lookups`` are present, with their entries: O(first + lookups) whatever the room's
        size. None when Redis is unavailable."""

        def parse(replies: list[Any]) -> RoomRead:
            decode = id_decoder()
            present, page, found, invisible, entries, complete = replies[0]
            shown = {
                member: (bool(int(inv)), _text(meta) if meta else None)
                for member, inv, meta in zip(
                    entries[::3], entries[1::3], entries[2::3], strict=True
                )
            }
            members: dict[UserId, MemberEntry] = {}
            for flat in (page, found):
                for member, joined in zip(flat[::2], flat[1::2], strict=True):
                    members[decode(member)] = MemberEntry(float(joined), *shown[member])
            return RoomRead(
                present=max(int(present), 0),
                members=members,
                found=frozenset(decode(m) for m in found[::2]),
                invisible=frozenset(decode(m) for m in invisible),
                complete=bool(complete),
                horizon=float(page[-1]) if page else None,
            )

        return Plan(
            commands=[
                script_call(
                    ROOM_READ,
                    self.room_keys(room),
                    [
                        int(now),
                        first,
                        "public" if public_only else "all",
                        *(encode_id(uid) for uid in dict.fromkeys(lookups)),
                    ],
                )
            ],
            parse=parse,
            fallback=None,
        )

    def read_room_page(
        self,
        room: str,
        now: float,
        first: int,
        after: float | None,
        lookups: list[UserId] | tuple[UserId, ...] = (),
    ) -> Plan[RoomPage | None]:
        """A page of the room: its count, at least ``first`` of its members present who joined
        at or after ``after`` (ms; None: from the start), unless the room ends first, every
        member of the page's last millisecond, and which of ``lookups`` are present, with
        their entries: O(first + lookups + log n) wherever the page starts (docs/rooms.md,
        "Paging"). None when Redis is unavailable."""
        return Plan(
            commands=[
                script_call(
                    ROOM_PAGE,
                    self.room_keys(room),
                    [
                        int(now),
                        first,
                        -1 if after is None else int(after),
                        *(encode_id(uid) for uid in dict.fromkeys(lookups)),
                    ],
                )
            ],
            parse=lambda replies: _room_page(replies[0]),
            fallback=None,
        )

    def claim_room_entry(self, room: str, entry: str) -> Plan[bool]:
        """Claims a transition's entry in the room's outbox (presence.store.plans.outbox)."""
        return claim(self.keys.room_key(room, "o"), entry)

    def room_count(self, room: str, now: float) -> Plan[int | None]:
        """Members present in ``room`` (invisible ones too): the members recorded minus those
        whose stay ended and who are not swept yet (a range of the per-second counts of stays
        ending, O(log n + the seconds not swept yet)), in one script call."""
        return Plan(
            commands=[script_call(ROOM_COUNT, self.room_keys(room), [int(now)])],
            parse=lambda replies: max(int(replies[0]), 0),
            fallback=None,
        )

    def prune_room(self, room: str, now: float, limit: int) -> Plan[Pruned]:
        """Remove up to ``limit`` members whose stay ended, each one's leave recorded in the
        room's outbox, and claim the outbox's entries left past their deadline (their caller
        never claimed them): see :class:`Pruned`."""

        def parse(replies: list[Any]) -> Pruned:
            due, made, stale, emptied = replies[0]
            # the leaves made are the members removed (one batch entry)
            left = _transitions(room, made)
            return Pruned(
                [t[1] for t in left],
                math.inf if not due else float(due),
                [*left, *_transitions(room, stale, claimed=True)],
                bool(emptied),
            )

        deadline = outbox_deadline(self.conf)
        return Plan(
            commands=[
                script_call(
                    ROOM_PRUNE,
                    self.room_keys(room),
                    [int(now), limit, math.floor(now - deadline), math.ceil(deadline)],
                ),
            ],
            parse=parse,
            fallback=RAISE,
        )

    def claim_rooms(self, now: float, limit: int) -> Plan[list[str]]:
        """Rooms due to be swept, taken out of their schedules (each handed to one sweeper):
        up to ``limit`` from each shard. A shard on an unavailable master is skipped."""

        def parse(replies: list[Any]) -> list[str]:
            return [
                str(room) for reply in replies if not isinstance(reply, Exception) for room in reply
            ]

        return Plan(
            commands=[
                script_call(ROOM_CLAIM, [key], [int(now), limit])
                for key in self.keys.room_schedules()
            ],
            parse=parse,
            fallback=[],
            partial=parse,
        )

    def schedule_missing_rooms(self, rooms: list[str], at: float) -> Plan[bool]:
        """Schedule these rooms at ``at`` unless they are scheduled already (rooms whose keys
        outlived their schedule entry: a sweeper stopped between claiming and putting back)."""
        by_key: dict[str, list[Any]] = defaultdict(list)
        for room in rooms:
            by_key[self.keys.room_schedule_key(room)] += [math.floor(at), room]  # due at ``at``
        return Plan(
            commands=[("ZADD", key, "NX", *args) for key, args in by_key.items()],
            parse=lambda replies: True,
            fallback=RAISE,
        )

    def schedule_rooms(self, due: dict[str, float]) -> Plan[bool]:
        """Sweep these rooms again at these times (an earlier time already set is kept)."""
        by_key: dict[str, list[Any]] = defaultdict(list)
        for room, at in due.items():
            by_key[self.keys.room_schedule_key(room)] += [math.ceil(at), room]
        return Plan(
            commands=[("ZADD", key, "LT", *args) for key, args in by_key.items()],
            parse=lambda replies: True,
            fallback=False,
        )
