"""Plans: the commands of one store operation, how to read their replies, and what to answer
when Redis is unavailable. Building a plan does no I/O; :mod:`presence.store.client` runs it
(one pipeline, one round trip) under the one failure policy.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from presence import domain
from presence.store.keys import SCORE_FACTOR, KeyScheme, decode_score
from presence.store.scripts import (
    CLAIM_DUE,
    CONNECTION,
    DESCRIBE_CONNECTIONS,
    READ_RECENT,
    REMOVE_IF_UNCHANGED,
    SIGN_OFF,
    TOUCH,
    Script,
)
from presence.users import UserId, encode_id, id_decoder, pk_kind

T = TypeVar("T")


class Raise:
    """The type of :data:`RAISE` (a plan's fallback that is not a value)."""


#: a plan's fallback meaning "raise StoreUnavailable" (plans that must not fail silently)
RAISE = Raise()

#: buckets one READ_RECENT script reads on one Redis: Redis runs one script at a time, so a
#: long read is cut into scripts of about a millisecond each, sent in the same pipeline
READ_RECENT_KEYS = 512


@dataclass
class Plan(Generic[T]):
    """Commands sent together in one pipeline, and how to read their replies."""

    commands: list[tuple[Any, ...]]
    parse: Callable[[list[Any]], T]
    #: returned when Redis is unavailable; RAISE to raise StoreUnavailable instead
    fallback: T | Raise
    #: on a cluster with a master unavailable: reads the replies of the other masters (the
    #: unavailable ones' replies are the exceptions); None: the whole plan falls back
    partial: Callable[[list[Any]], T] | None = None


def merge(plans: Sequence[Plan[T]]) -> Plan[list[T]]:
    """Several plans as one (one round trip); falls back to each plan's fallback, or raises
    if any plan must not fail silently."""
    bounds: list[tuple[int, int]] = []
    commands: list[tuple[Any, ...]] = []
    for plan in plans:
        bounds.append((len(commands), len(commands) + len(plan.commands)))
        commands += plan.commands

    def parse(replies: list[Any]) -> list[T]:
        return [plan.parse(replies[a:b]) for plan, (a, b) in zip(plans, bounds, strict=True)]

    fallback: list[T] | Raise = RAISE
    partial: Callable[[list[Any]], list[T]] | None = None
    if not any(isinstance(plan.fallback, Raise) for plan in plans):
        fallback = [plan.fallback for plan in plans]  # type: ignore[misc]

        def partial(replies: list[Any]) -> list[T]:
            # Each plan whose commands all ran is read; the others fall back (or read partly).
            results: list[T] = []
            for plan, (a, b) in zip(plans, bounds, strict=True):
                part = replies[a:b]
                if not any(isinstance(reply, Exception) for reply in part):
                    results.append(plan.parse(part))
                elif plan.partial is not None:
                    results.append(plan.partial(part))
                else:
                    results.append(plan.fallback)  # type: ignore[arg-type]
            return results

    return Plan(commands=commands, parse=parse, fallback=fallback, partial=partial)


def script_call(script: Script, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
    return ("SCRIPT", script, tuple(keys), tuple(args))


def _pairs(reply: list[Any]) -> list[tuple[Any, Any]]:
    """(member, score) pairs of a WITHSCORES reply, flat (RESP2 raw) or paired (parsed)."""
    if reply and isinstance(reply[0], list | tuple):
        return [(member, score) for member, score in reply]
    return list(zip(reply[::2], reply[1::2], strict=True))


@dataclass(frozen=True)
class StaleEntry:
    user_id: UserId
    bucket: int
    score: str

    @property
    def state(self) -> domain.LiveState:
        return decode_score(self.score)

    @property
    def seen_at(self) -> float:
        last_active = self.state.last_active
        assert last_active is not None
        return last_active


ConnectionOp = Literal["open", "beat", "close", "expire"]


@dataclass(frozen=True)
class Transition:
    """A user's live state before and after a write."""

    user_id: UserId
    before: domain.LiveState
    after: domain.LiveState
    #: live connections left (connection writes only)
    connections: int | None = None
    #: a new connection past MAX_CONNECTIONS_PER_USER: nothing was recorded
    refused: bool = False
    #: connections this write found crashed (not heard from for CONNECTION_TTL) and dropped
    crashed: int = 0

    @classmethod
    def from_reply(cls, user_id: UserId, reply: list[Any]) -> Transition:
        return cls(
            user_id,
            decode_score(reply[0]),
            decode_score(reply[1]),
            int(reply[2]) if len(reply) > 2 else None,
            bool(int(reply[3])) if len(reply) > 3 else False,
            int(reply[4]) if len(reply) > 4 else 0,
        )


class PlanBuilder(KeyScheme):
    """Every plan of the store, over its key scheme."""

    def touch(self, user_id: UserId, device: domain.Device, now: float) -> Plan[Transition | None]:
        """Record a request. The user is due to turn offline ONLINE_WINDOW later at the latest
        (``LT``: an earlier due time, such as a connection's, is kept)."""
        seconds = int(now)
        return Plan(
            commands=[
                script_call(
                    TOUCH,
                    [
                        self.seen_key(self.bucket_of(user_id)),
                        self.conns_key(self.bucket_of(user_id)),
                    ],
                    [
                        encode_id(user_id),
                        seconds,
                        domain.DEVICE_BITS[device],
                        seconds - self.conf.ONLINE_WINDOW,
                        self._ttl_start(seconds),
                    ],
                ),
                (
                    "ZADD",
                    self.user_due_key(user_id),
                    "LT",
                    seconds + self.conf.ONLINE_WINDOW,
                    encode_id(user_id),
                ),
            ],
            parse=lambda replies: Transition.from_reply(user_id, replies[0]),
            fallback=None,
        )

    def sign_off(
        self, user_id: UserId, device: domain.Device, now: float
    ) -> Plan[Transition | None]:
        seconds = int(now)
        return Plan(
            commands=[
                script_call(
                    SIGN_OFF,
                    [self.seen_key(self.bucket_of(user_id))],
                    [
                        encode_id(user_id),
                        seconds,
                        domain.DEVICE_BITS[device],
                        self._ttl_start(seconds),
                    ],
                ),
                (
                    "ZADD",
                    self.user_due_key(user_id),
                    seconds + domain.SECOND + self.conf.OFFLINE_GRACE,
                    encode_id(user_id),
                ),
            ],
            parse=lambda replies: Transition.from_reply(user_id, replies[0]),
            fallback=None,
        )

    def connection(
        self,
        user_id: UserId,
        op: ConnectionOp,
        now: float,
        connection_id: str = "-",
        device: domain.Device = domain.Device.WEB,
        idle: bool = False,
    ) -> Plan[Transition | None]:
        """A connection's opening ("open"), heartbeat ("beat"), close, or ("expire") a check
        that drops the user's connections not heard from for CONNECTION_TTL.

        An open (or a beat of a connection no longer live) while the user has
        MAX_CONNECTIONS_PER_USER live connections is refused (``Transition.refused``) and
        records nothing. One round trip: the script, then the user's due time (a heartbeat's
        TTL, or the grace after the last connection closed); an open sets its due time only
        once accepted (:meth:`connected`), so a refused one leaves no trace at all.
        """
        bucket = self.bucket_of(user_id)
        seconds = int(now)
        commands: list[tuple[Any, ...]] = [
            script_call(
                CONNECTION,
                [self.seen_key(bucket), self.conns_key(bucket), self.expiries_key(bucket)],
                [
                    encode_id(user_id),
                    op,
                    connection_id,
                    domain.DEVICE_BITS[device],
                    int(idle),
                    seconds,
                    self._ttl_start(seconds),
                    seconds - self.conf.ONLINE_WINDOW,
                    self.conf.MAX_CONNECTIONS_PER_USER,
                ],
            )
        ]
        if op == "beat":
            commands.append(self._connected_due(user_id, seconds))
        elif op == "close":
            commands.append(
                (
                    "ZADD",
                    self.user_due_key(user_id),
                    seconds + domain.SECOND + self.conf.OFFLINE_GRACE,
                    encode_id(user_id),
                )
            )
        return Plan(
            commands=commands,
            parse=lambda replies: Transition.from_reply(user_id, replies[0]),
            fallback=None,
        )

    def _ttl_start(self, seconds: int) -> int:
        """The scripts' "start of the connection TTL": a heartbeat recorded in a later second is
        live. The TTL counts from the end of the heartbeat's second, as in domain.offline_at."""
        return seconds - domain.SECOND - self.conf.CONNECTION_TTL

    def _connected_due(self, user_id: UserId, seconds: int) -> tuple[Any, ...]:
        return (
            "ZADD",
            self.user_due_key(user_id),
            seconds + domain.SECOND + self.conf.CONNECTION_TTL,
            encode_id(user_id),
        )

    def connected(self, user_id: UserId, now: float) -> Plan[bool]:
        """The due time of a user whose connection was just opened (heartbeat + TTL)."""
        return Plan(
            commands=[self._connected_due(user_id, int(now))],
            parse=lambda replies: True,
            fallback=False,
        )

    def describe_connections(self, user_id: UserId) -> Plan[list[str]]:
        """The user's connections as "id:device_bit:idle:connected_at:heartbeat" and the devices
        of their page views while connected as "h<bit>:bit:1:at:at" (inspection and tests)."""
        bucket = self.bucket_of(user_id)
        return Plan(
            commands=[
                script_call(
                    DESCRIBE_CONNECTIONS,
                    [self.conns_key(bucket), self.expiries_key(bucket)],
                    [encode_id(user_id), domain.SECOND + self.conf.CONNECTION_TTL],
                )
            ],
            parse=lambda replies: [str(entry) for entry in replies[0]],
            fallback=RAISE,
        )

    def claim_due(self, now: float, limit: int) -> Plan[tuple[list[UserId], list[UserId]]]:
        """Users due to turn offline and users whose custom status expired, taken out of their
        schedules (each handed to one sweeper only): up to ``limit`` of each on one Redis; on a
        cluster up to ``limit / CLUSTER_SHARDS`` (at least 16) of each from every shard, one
        round trip per master. A shard on an unavailable master is skipped."""
        schedules = self.schedules()
        per_schedule = limit if len(schedules) == 1 else max(16, -(-limit // len(schedules)))

        def parse(replies: list[Any]) -> tuple[list[UserId], list[UserId]]:
            decode = id_decoder()
            due: list[UserId] = []
            expiring: list[UserId] = []
            for reply in replies:
                if isinstance(reply, Exception):
                    continue
                due += [decode(m) for m in reply[0]]
                expiring += [decode(m) for m in reply[1]]
            return due, expiring

        return Plan(
            commands=[
                script_call(CLAIM_DUE, [due_key, expiring_key], [int(now), per_schedule])
                for due_key, expiring_key in schedules
            ],
            parse=parse,
            fallback=([], []),
            partial=parse,
        )

    def schedule(self, due: dict[UserId, float]) -> Plan[bool]:
        """Check these users again at these times (an earlier time already set is kept)."""
        by_key: dict[str, list[Any]] = defaultdict(list)
        for user_id, at in due.items():
            # Claims compare whole seconds (due <= int(now)): the ceiling is never early.
            by_key[self.user_due_key(user_id)] += [math.ceil(at), encode_id(user_id)]
        return Plan(
            commands=[("ZADD", key, "LT", *args) for key, args in by_key.items()],
            parse=lambda replies: True,
            fallback=False,
        )

    def schedule_expiry(self, user_id: UserId, at: float | None) -> Plan[bool]:
        """Announce the user's custom status clearing at ``at`` (None: it never expires)."""
        key = self.user_expiring_key(user_id)
        command: tuple[Any, ...] = (
            ("ZADD", key, int(at) + 1, encode_id(user_id))
            if at is not None
            else ("ZREM", key, encode_id(user_id))
        )
        return Plan(commands=[command], parse=lambda replies: True, fallback=False)

    def prune_schedules(self, before: float) -> Plan[int]:
        """Forget due times long past (sites without a live process never sweep them)."""
        return Plan(
            commands=[
                ("ZREMRANGEBYSCORE", key, "-inf", f"({int(before)}")
                for keys in self.schedules()
                for key in keys
            ],
            parse=lambda replies: sum(int(reply) for reply in replies),
            fallback=RAISE,
        )

    def read(self, user_ids: Iterable[UserId]) -> Plan[dict[UserId, domain.LiveState] | None]:
        """Live state of many users in one round trip (one ZMSCORE per bucket).

        Falls back to None (unknown) when Redis is unavailable, so callers can tell
        "not online" from "cannot tell".
        """
        buckets = self.by_bucket(set(user_ids))

        def parse(replies: list[Any]) -> dict[UserId, domain.LiveState] | None:
            states: dict[UserId, domain.LiveState] = {}
            for (_, members), scores in zip(buckets, replies, strict=True):
                if isinstance(scores, Exception):
                    continue  # an unavailable master's users: unknown, read as not live
                for user_id, score in zip(members, scores, strict=True):
                    if score is not None:
                        states[user_id] = decode_score(score)
            return states

        return Plan(
            commands=[
                ("ZMSCORE", self.seen_key(bucket), *map(encode_id, members))
                for bucket, members in buckets
            ],
            parse=parse,
            fallback=None,
            partial=parse,
        )

    def read_recent(
        self, user_ids: Iterable[UserId], since: float
    ) -> Plan[dict[UserId, domain.LiveState] | None]:
        """Live state of those of many users active (or signed off) since ``since``: the ones
        who may be live (``domain.live_status`` decides), the others are left out. One round
        trip (one per master on a cluster), whose reply carries only those users.

        A script per :data:`READ_RECENT_KEYS` buckets (per shard on a cluster: one slot per
        script) reads them with ZMSCORE and returns only the recent entries, so a long list of
        mostly offline users costs Redis no reply for the offline ones and Python no parsing.
        Falls back to None (unknown) when Redis is unavailable, as :meth:`read` does.
        """
        low = int(since) * SCORE_FACTOR
        buckets = self.by_bucket(set(user_ids))
        batches: list[list[tuple[int, tuple[UserId, ...]]]]
        if self.clustered:
            # A script's keys must share one slot: a shard's buckets.
            by_shard: dict[int, list[tuple[int, tuple[UserId, ...]]]] = defaultdict(list)
            for bucket, members in buckets:
                by_shard[self.shard_of(bucket)].append((bucket, members))
            batches = list(by_shard.values())
        else:
            batches = [
                buckets[start : start + READ_RECENT_KEYS]
                for start in range(0, len(buckets), READ_RECENT_KEYS)
            ]
        # An integer id is its own canonical form: no call per id.
        as_is = pk_kind() == "int"
        commands = []
        for batch in batches:
            # The buckets holding one of these users first, with no count each (most of them).
            singles = [(bucket, members) for bucket, members in batch if len(members) == 1]
            others = [(bucket, members) for bucket, members in batch if len(members) > 1]
            args: list[Any] = [low, len(singles)]
            args += (members[0] if as_is else encode_id(members[0]) for _, members in singles)
            for _, members in others:
                args.append(len(members))
                args += members if as_is else map(encode_id, members)
            keys = [self.seen_key(bucket) for bucket, _ in singles + others]
            commands.append(script_call(READ_RECENT, keys, args))

        def parse(replies: list[Any]) -> dict[UserId, domain.LiveState] | None:
            decode = id_decoder()
            states: dict[UserId, domain.LiveState] = {}
            for reply in replies:
                if isinstance(reply, Exception):
                    continue  # an unavailable master's users: unknown, read as not live
                pairs = iter(reply)
                for member, score in zip(pairs, pairs, strict=True):
                    states[decode(member)] = decode_score(score)
            return states

        return Plan(
            commands=commands,
            parse=parse,
            fallback=None,
            partial=parse,
        )

    def scan_stale(self, buckets: Sequence[int], before: float) -> Plan[list[StaleEntry]]:
        """Entries last active before ``before`` (and every signed-off one) in these buckets."""
        threshold = int(before) * SCORE_FACTOR

        def parse(replies: list[Any]) -> list[StaleEntry]:
            decode = id_decoder()
            entries: list[StaleEntry] = []
            for bucket, reply in zip(buckets, replies, strict=True):
                for member, score in _pairs(reply):
                    entries.append(StaleEntry(decode(member), bucket, str(int(float(score)))))
            return entries

        return Plan(
            commands=[
                # "(" makes the bound exclusive.
                ("ZRANGEBYSCORE", self.seen_key(bucket), "-inf", f"({threshold}", "WITHSCORES")
                for bucket in buckets
            ],
            parse=parse,
            fallback=RAISE,
        )

    def scan_recent(
        self, buckets: Sequence[int], since: float
    ) -> Plan[list[tuple[UserId, domain.LiveState]]]:
        """Users of these buckets active since ``since``, or who signed off since then (the
        candidates of "online now"; domain.live_status decides)."""
        low = int(since) * SCORE_FACTOR

        def parse(replies: list[Any]) -> list[tuple[UserId, domain.LiveState]]:
            decode = id_decoder()
            return [
                (decode(member), decode_score(score))
                for reply in replies
                for member, score in _pairs(reply)
            ]

        commands: list[tuple[Any, ...]] = []
        for bucket in buckets:
            key = self.seen_key(bucket)
            commands.append(("ZRANGEBYSCORE", key, low, "+inf", "WITHSCORES"))
            commands.append(("ZRANGEBYSCORE", key, "-inf", -low, "WITHSCORES"))
        return Plan(commands=commands, parse=parse, fallback=RAISE)

    def remove_unchanged(self, entries: Iterable[StaleEntry]) -> Plan[int]:
        grouped: dict[int, list[Any]] = defaultdict(list)
        for entry in entries:
            grouped[entry.bucket] += [encode_id(entry.user_id), entry.score]
        return Plan(
            commands=[
                script_call(
                    REMOVE_IF_UNCHANGED,
                    [self.seen_key(bucket), self.conns_key(bucket), self.expiries_key(bucket)],
                    args,
                )
                for bucket, args in grouped.items()
            ],
            parse=lambda replies: sum(int(r) for r in replies),
            fallback=RAISE,
        )
