"""The plans of the two schedules: users due to turn offline and custom statuses expiring
(claimed by the sweeps, set by writes and status changes, pruned by cleanup). No I/O.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from presence.store.keys import expiry_score
from presence.store.plans.plan import RAISE, Plan, PlanArea, script_call
from presence.store.scripts import CLAIM_DUE, RELEASE
from presence.users import UserId, encode_id, id_decoder


class SchedulePlans(PlanArea):
    """The plans that claim, set and prune the schedules, over the key scheme."""

    def lease_end(self, now: float) -> float:
        """When a claim made ``now`` lapses: LIVE_SOCKET_TIMEOUT later, the next sweep anywhere
        takes the users of a sweeper that died (lua/claim_due.lua). A live sweeper slower than
        that only shares its work: the ledger sends no signal twice and a second announcement
        changes no view."""
        return round(now + self.conf.LIVE_SOCKET_TIMEOUT, 3)

    def claim_due(
        self, now: float, limit: int, lease_end: float | None = None
    ) -> Plan[tuple[list[UserId], list[UserId]]]:
        """Users due to turn offline (with those whose claim lapsed) and users whose custom
        status expired, taken out of their schedules (each handed to one sweeper only): up to
        ``limit`` of each on one Redis; on a cluster up to ``limit / CLUSTER_SHARDS`` (at least
        16) of each from every shard, one round trip per master. A shard on an unavailable
        master is skipped. The due users are leased until ``lease_end`` (default
        :meth:`lease_end`): a sweeper gives them back with :meth:`release` once done, and one
        killed before that leaves them to the next sweep after the lease."""
        schedules = self.keys.schedules()
        lease = self.lease_end(now) if lease_end is None else lease_end
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
                script_call(
                    CLAIM_DUE,
                    [due_key, expiring_key, self.keys.lease_key(shard)],
                    [int(now), per_schedule, lease],
                )
                for shard, (due_key, expiring_key) in enumerate(schedules)
            ],
            parse=parse,
            fallback=([], []),
            partial=parse,
        )

    def release(
        self, lease_end: float, user_ids: list[UserId], later: dict[UserId, float]
    ) -> Plan[bool]:
        """A sweeper is done with the users it leased until ``lease_end``: those still online
        are due again at their ``later`` time (an earlier one already set is kept), then every
        one still leased to it is given back. One round trip (one per master on a cluster)."""
        by_shard: dict[int, list[Any]] = defaultdict(list)
        for user_id in user_ids:
            by_shard[self.keys.shard_of(self.keys.bucket_of(user_id))].append(encode_id(user_id))
        return Plan(
            commands=[
                *self.schedule(later).commands,
                *(
                    script_call(RELEASE, [self.keys.lease_key(shard)], [lease_end, *members])
                    for shard, members in by_shard.items()
                ),
            ],
            parse=lambda replies: True,
            fallback=False,
        )

    def schedule(self, due: dict[UserId, float]) -> Plan[bool]:
        """Check these users again at these times (an earlier time already set is kept)."""
        by_key: dict[str, list[Any]] = defaultdict(list)
        for user_id, at in due.items():
            # Claims compare whole seconds (due <= int(now)): the ceiling is never early.
            by_key[self.keys.user_due_key(user_id)] += [math.ceil(at), encode_id(user_id)]
        return Plan(
            commands=[("ZADD", key, "LT", *args) for key, args in by_key.items()],
            parse=lambda replies: True,
            fallback=False,
        )

    def schedule_expiry(self, user_id: UserId, at: float | None) -> Plan[bool]:
        """Announce the user's custom status clearing at ``at`` (None: it never expires)."""
        key = self.keys.user_expiring_key(user_id)
        command: tuple[Any, ...] = (
            ("ZADD", key, expiry_score(at), encode_id(user_id))
            if at is not None
            else ("ZREM", key, encode_id(user_id))
        )
        return Plan(commands=[command], parse=lambda replies: True, fallback=False)

    def prune_schedules(self, before: float) -> Plan[int]:
        """Forget due times long past (sites without a live process never sweep them). On a
        cluster with a master unavailable, the others' are forgotten (its own, next time)."""

        def parse(replies: list[Any]) -> int:
            return sum(int(reply) for reply in replies if not isinstance(reply, Exception))

        return Plan(
            commands=[
                ("ZREMRANGEBYSCORE", key, "-inf", f"({int(before)}")
                for keys in self.keys.schedules()
                for key in keys
            ],
            parse=parse,
            fallback=RAISE,
            partial=parse,
        )
