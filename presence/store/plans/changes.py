"""The plans of the change stamps: when each user's visible presence last changed, kept for a
short while, so that a page (or a reconnecting client) that shows what it resolved at a known
time is sent only the users who changed since (presence.stamps). No I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from presence.store.plans.plan import Plan, PlanArea, script_call
from presence.store.scripts import CHANGED_SINCE, STAMP_CHANGES
from presence.users import UserId, encode_id, id_decoder


class ChangePlans(PlanArea):
    """Change stamps: one sorted set per shard (one on one Redis), in the slot of the shard's
    schedules, which a reader of stamps reads in the same script."""

    def _by_shard(self, user_ids: Iterable[UserId]) -> dict[int, list[Any]]:
        keys = self.keys
        buckets, tags = keys.conf.BUCKETS, len(keys.tags)
        shards: dict[int, list[Any]] = defaultdict(list)
        for user_id in dict.fromkeys(user_ids):
            if type(user_id) is int:
                # bucket_of, shard_of and encode_id of an integer id, inline: a page view's
                # socket reads the stamps of its 50 users.
                shards[user_id % buckets % tags].append(user_id)
            else:
                shards[keys.shard_of(keys.bucket_of(user_id))].append(encode_id(user_id))
        return shards

    def stamp_changes(self, user_ids: Iterable[UserId], now: float, keep: float) -> Plan[bool]:
        """These users' visible presence changed at ``now`` (written before it is announced);
        stamps older than ``keep`` seconds are forgotten. False when Redis is unavailable."""
        commands = [
            script_call(
                STAMP_CHANGES,
                [self.keys.changes_key(shard), self.keys.changes_epoch_key(shard)],
                [repr(now), repr(now - keep), *members],
            )
            for shard, members in self._by_shard(user_ids).items()
        ]
        return Plan(commands=commands, parse=lambda replies: True, fallback=False)

    def changed_since(
        self, user_ids: Iterable[UserId], low: float, high: float
    ) -> Plan[tuple[float, set[UserId]] | None]:
        """The users among ``user_ids`` who may look different now than at ``low`` (a change
        stamped since, or a schedule due between ``low`` and ``high``), with the earliest time
        since which the shards read kept every stamp (their epoch). None when Redis is
        unavailable or a shard keeps no epoch (flushed): nothing can be proven then."""
        shards = self._by_shard(user_ids)
        commands = []
        for shard, members in shards.items():
            scheme = self.keys
            keys = [
                scheme.changes_key(shard),
                scheme.changes_epoch_key(shard),
                scheme._schedule_key(shard, "due"),
                scheme._schedule_key(shard, "expiring"),
                scheme.lease_key(shard),
            ]
            commands.append(script_call(CHANGED_SINCE, keys, [repr(low), repr(high), *members]))

        def parse(replies: list[Any]) -> tuple[float, set[UserId]] | None:
            decode = id_decoder()
            changed: set[UserId] = set()
            kept_since = 0.0
            for reply in replies:
                if isinstance(reply, Exception) or not reply or reply[0] is None:
                    return None
                kept_since = max(kept_since, float(reply[0]))
                changed.update(decode(member) for member in reply[1:])
            return kept_since, changed

        return Plan(commands=commands, parse=parse, fallback=None)
