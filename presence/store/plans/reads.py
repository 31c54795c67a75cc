"""The plans that read many users' live state in one round trip (one per master on a
cluster). No I/O.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from presence import domain
from presence.store.keys import SCORE_FACTOR, decode_score
from presence.store.plans.plan import Plan, PlanArea, script_call
from presence.store.scripts import READ_RECENT
from presence.users import UserId, encode_id, id_decoder, pk_kind

#: buckets one READ_RECENT script reads on one Redis: Redis runs one script at a time, so a
#: long read is cut into scripts of about a millisecond each, sent in the same pipeline
READ_RECENT_KEYS = 512


def with_prior(state: domain.LiveState, prior: float | str | None) -> domain.LiveState:
    """``state`` with the last seen before its UTC day, if the prior set holds one."""
    if prior is None:
        return state
    return dataclasses.replace(state, prior=float(prior))


class ReadPlans(PlanArea):
    """The plans that read users' live state, over the key scheme."""

    def read(self, user_ids: Iterable[UserId]) -> Plan[dict[UserId, domain.LiveState] | None]:
        """Live state of many users in one round trip (one ZMSCORE per bucket).

        Falls back to None (unknown) when Redis is unavailable, so callers can tell
        "not online" from "cannot tell".
        """
        buckets = self.keys.by_bucket(set(user_ids))

        def parse(replies: list[Any]) -> dict[UserId, domain.LiveState] | None:
            states: dict[UserId, domain.LiveState] = {}
            count = len(buckets)
            for (_, members), scores, priors in zip(
                buckets, replies[:count], replies[count:], strict=True
            ):
                if isinstance(scores, Exception) or isinstance(priors, Exception):
                    continue  # an unavailable master's users: unknown, read as not live
                for user_id, score, prior in zip(members, scores, priors, strict=True):
                    if score is not None:
                        states[user_id] = with_prior(decode_score(score), prior)
            return states

        # Each bucket's seen set, then its prior set (the same slot), in the same round trip.
        return Plan(
            commands=[
                ("ZMSCORE", self.keys.seen_key(bucket), *map(encode_id, members))
                for bucket, members in buckets
            ]
            + [
                ("ZMSCORE", self.keys.prior_key(bucket), *map(encode_id, members))
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
        buckets = self.keys.by_bucket(set(user_ids))
        batches: list[list[tuple[int, tuple[UserId, ...]]]]
        if self.keys.clustered:
            # A script's keys must share one slot: a shard's buckets.
            by_shard: dict[int, list[tuple[int, tuple[UserId, ...]]]] = defaultdict(list)
            for bucket, members in buckets:
                by_shard[self.keys.shard_of(bucket)].append((bucket, members))
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
            # An entry since ``since`` may be of today: its prior is read (the script's second
            # argument; lua/read_recent.lua).
            args: list[Any] = [low, low, len(singles)]
            args += (members[0] if as_is else encode_id(members[0]) for _, members in singles)
            for _, members in others:
                args.append(len(members))
                args += members if as_is else map(encode_id, members)
            ordered = [bucket for bucket, _ in singles + others]
            keys = [*map(self.keys.seen_key, ordered), *map(self.keys.prior_key, ordered)]
            commands.append(script_call(READ_RECENT, keys, args))

        def parse(replies: list[Any]) -> dict[UserId, domain.LiveState] | None:
            decode = id_decoder()
            states: dict[UserId, domain.LiveState] = {}
            for reply in replies:
                if isinstance(reply, Exception):
                    continue  # an unavailable master's users: unknown, read as not live
                triples = iter(reply)
                for member, score, prior in zip(triples, triples, triples, strict=True):
                    states[decode(member)] = with_prior(decode_score(score), prior)
            return states

        return Plan(
            commands=commands,
            parse=parse,
            fallback=None,
            partial=parse,
        )
