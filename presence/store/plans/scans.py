"""The plans that scan whole buckets: the stale entries cleanup removes (unless they changed
meanwhile), and the recently active users of "online now". No I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from presence import domain
from presence.store.keys import SCORE_FACTOR, decode_score
from presence.store.plans.plan import RAISE, Plan, PlanArea, script_call
from presence.store.scripts import REMOVE_IF_UNCHANGED
from presence.users import UserId, encode_id, id_decoder


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


@dataclass
class Removal:
    """What :meth:`ScanPlans.remove_unchanged` did: entries removed, and the users it made
    offline in the ledger, as (user id, invisible, offline since, outbox entry: whoever
    claims it sends ``user_offline``, presence.outbox)."""

    removed: int = 0
    offline: list[tuple[UserId, bool, float, str]] = field(default_factory=list)


class ScanPlans(PlanArea):
    """The plans that scan buckets and remove stale entries, over the key scheme."""

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
                ("ZRANGEBYSCORE", self.keys.seen_key(bucket), "-inf", f"({threshold}", "WITHSCORES")
                for bucket in buckets
            ],
            parse=parse,
            fallback=RAISE,
        )

    def stale_priors(self, entries: Iterable[StaleEntry]) -> Plan[dict[UserId, float]]:
        """The last seen of an earlier UTC day that each entry's user's last seen replaced
        (the bucket's prior set, lua/prior.lua), where there is one: one ZMSCORE per bucket."""
        grouped: dict[int, list[UserId]] = defaultdict(list)
        for entry in entries:
            grouped[entry.bucket].append(entry.user_id)
        buckets = list(grouped.items())

        def parse(replies: list[Any]) -> dict[UserId, float]:
            return {
                user_id: float(score)
                for (_, users), scores in zip(buckets, replies, strict=True)
                for user_id, score in zip(users, scores, strict=True)
                if score is not None
            }

        return Plan(
            commands=[
                ("ZMSCORE", self.keys.prior_key(bucket), *map(encode_id, users))
                for bucket, users in buckets
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
            key = self.keys.seen_key(bucket)
            commands.append(("ZRANGEBYSCORE", key, low, "+inf", "WITHSCORES"))
            commands.append(("ZRANGEBYSCORE", key, "-inf", -low, "WITHSCORES"))
        return Plan(commands=commands, parse=parse, fallback=RAISE)

    def remove_unchanged(self, entries: Iterable[StaleEntry], now: float) -> Plan[int]:
        """Removes these entries unless they changed since read; how many were removed (see
        :meth:`remove_stale`)."""
        plan = self.remove_stale(entries, now)
        read = plan.parse
        return Plan(plan.commands, lambda replies: read(replies).removed, RAISE)

    def remove_stale(self, entries: Iterable[StaleEntry], now: float) -> Plan[Removal]:
        """Removes these entries unless they changed since read (with their users' last seen
        of an earlier day, :meth:`stale_priors`, persisted first); those still in the online
        ledger (nobody swept them: a site without live processes) leave it there and then,
        their offline recorded in the shard's outbox at ``now``, and :attr:`Removal.offline`
        says so, for ``user_offline``."""
        grouped: dict[int, list[Any]] = defaultdict(list)
        for entry in entries:
            grouped[entry.bucket] += [encode_id(entry.user_id), entry.score]

        def parse(replies: list[Any]) -> Removal:
            decode = id_decoder()
            removal = Removal()
            for removed, left in replies:
                removal.removed += int(removed)
                for i in range(0, len(left), 4):
                    user_id, invisible = decode(left[i]), bool(int(left[i + 1]))
                    entry = left[i + 3]
                    entry = entry.decode() if isinstance(entry, bytes) else str(entry)
                    removal.offline.append((user_id, invisible, float(left[i + 2]), entry))
            return removal

        return Plan(
            commands=[
                script_call(
                    REMOVE_IF_UNCHANGED,
                    [
                        self.keys.seen_key(bucket),
                        self.keys.conns_key(bucket),
                        self.keys.expiries_key(bucket),
                        *self.keys.ledger_keys(self.keys.shard_of(bucket))[:2],
                        self.keys.outbox_key(self.keys.shard_of(bucket)),
                        # (its user's last seen of an earlier day goes with the entry)
                        self.keys.prior_key(bucket),
                    ],
                    [int(now), *args],
                )
                for bucket, args in grouped.items()
            ],
            parse=parse,
            fallback=RAISE,
        )
