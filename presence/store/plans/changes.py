"""The plans of the change stamps: when each user's visible presence last changed, kept for a
short while, so that a page (or a reconnecting client) that shows what it resolved at a known
time is sent only the users who changed since (presence.stamps). No I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from presence.domain import ANY_CHANGE, Change, Kind
from presence.store.plans.plan import Plan, PlanArea, script_call
from presence.store.scripts import CHANGED_SINCE, STAMP_CHANGES
from presence.users import UserId, encode_id, id_decoder

#: the kinds stamped each as a member of their own ('<bit>:<id>'; lua/changed_since.lua)
_KINDS = tuple(Kind)


def _pair_member(target: int | str, viewer: int | str, prefix: str = "p") -> str:
    """The stamp of a change of relation between ``target`` and ``viewer`` (encoded ids; prefix
    "b": of a block between them): the target's length first, so that no two pairs of ids
    spell the same member."""
    spelt = str(target)
    return f"{prefix}:{len(spelt.encode())}:{spelt}{viewer}"


def _members(encoded: int | str, change: Change) -> list[int | str]:
    """The members a change of ``change``'s kinds stamps for one user: its id, its kinds."""
    members: list[int | str] = [encoded]
    members.extend(f"{kind.value}:{encoded}" for kind in _KINDS if change.kinds & kind)
    others = [encode_id(other) for other in change.between]
    members.extend(_pair_member(encoded, other) for other in others)
    if change.kinds & Kind.BLOCK:
        members.extend(_pair_member(encoded, other, "b") for other in others)
    return members


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

    def stamp_changes(
        self, user_ids: Iterable[UserId], now: float, keep: float, change: Change = ANY_CHANGE
    ) -> Plan[bool]:
        """These users' visible presence changed at ``now`` (written before it is announced),
        in ``change``'s kinds; stamps older than ``keep`` seconds are forgotten. False when
        Redis is unavailable."""
        commands = [
            script_call(
                STAMP_CHANGES,
                [self.keys.changes_key(shard), self.keys.changes_epoch_key(shard)],
                [
                    repr(now),
                    repr(now - keep),
                    *(member for user in members for member in _members(user, change)),
                ],
            )
            for shard, members in self._by_shard(user_ids).items()
        ]
        return Plan(commands=commands, parse=lambda replies: True, fallback=False)

    def changed_since(
        self, user_ids: Iterable[UserId], viewer: UserId, low: float, high: float
    ) -> Plan[tuple[float, dict[UserId, Kind]] | None]:
        """The users among ``user_ids`` who may look different now than at ``low`` (a change
        stamped since, or a schedule due between ``low`` and ``high``), each with the kinds of
        their changes since (a change of relation only if it was with ``viewer``; no kinds: a
        change ``viewer`` cannot be told of), and the earliest time since which the shards
        read kept every stamp (their epoch). None when Redis is unavailable or a shard keeps
        no epoch (flushed): nothing can be proven then."""
        shards = self._by_shard(user_ids)
        spelt_viewer = encode_id(viewer)
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
            commands.append(
                script_call(CHANGED_SINCE, keys, [repr(low), repr(high), spelt_viewer, *members])
            )

        def parse(replies: list[Any]) -> tuple[float, dict[UserId, Kind]] | None:
            decode = id_decoder()
            changed: dict[UserId, Kind] = {}
            kept_since = 0.0
            for reply in replies:
                if isinstance(reply, Exception) or not reply or reply[0] is None:
                    return None
                kept_since = max(kept_since, float(reply[0]))
                for at in range(1, len(reply) - 1, 2):
                    changed[decode(reply[at])] = Kind(int(reply[at + 1]))
            return kept_since, changed

        return Plan(commands=commands, parse=parse, fallback=None)
