"""The plans of the guest count (``COUNT_GUESTS``): anonymous visitors, approximately, in one
HyperLogLog per time bucket. No I/O.

A visitor is added to the bucket of the moment as an opaque digest (presence.api._guests);
a HyperLogLog keeps no element, only 16,384 registers of at most 12 KB, so nothing of the
visitor can be read back. A count merges the buckets of the last ONLINE_WINDOW in one PFCOUNT
(Redis's standard error: 0.81%). Each bucket expires ONLINE_WINDOW + a bucket after its last
write: no key outlives its use.
"""

from __future__ import annotations

import math
from typing import Any

from presence.store.plans.plan import Plan, PlanArea


class GuestPlans(PlanArea):
    """The plans of the guest count, over the key scheme."""

    def guest_bucket(self, now: float) -> int:
        return math.floor(now / self.keys.guest_bucket_seconds())

    def note_guest(self, digest: str, now: float) -> Plan[bool | None]:
        """Add a visitor (its digest) to the bucket of ``now``: one PFADD and one EXPIRE, one
        round trip. Whether the HyperLogLog changed; None when Redis is unavailable."""
        key = self.keys.guest_key(self.guest_bucket(now))
        ttl = self.conf.ONLINE_WINDOW + self.keys.guest_bucket_seconds() + 1
        return Plan(
            commands=[("PFADD", key, digest), ("EXPIRE", key, ttl)],
            parse=lambda replies: bool(int(replies[0])),
            fallback=None,
        )

    def guest_keys(self, now: float) -> list[str]:
        """The buckets a count at ``now`` reads: those holding any moment of the last
        ONLINE_WINDOW (the oldest may hold up to a bucket more)."""
        first = self.guest_bucket(now - self.conf.ONLINE_WINDOW)
        return [self.keys.guest_key(b) for b in range(first, self.guest_bucket(now) + 1)]

    def count_guests(self, now: float) -> Plan[int | None]:
        """Distinct visitors of the last ONLINE_WINDOW: one PFCOUNT of its buckets (missing
        keys count as empty). None when Redis is unavailable."""

        def parse(replies: list[Any]) -> int:
            return int(replies[0])

        return Plan(commands=[("PFCOUNT", *self.guest_keys(now))], parse=parse, fallback=None)
