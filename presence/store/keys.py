"""The key scheme and the score encoding: where each piece of presence lives in Redis.

See docs/redis-layout.md. Every key of a user's live state carries its bucket as the hash tag
(``{KEY_PREFIX}:{<bucket>}:...``), so a script touching one user's keys stays in one Redis Cluster
slot, and small buckets stay in Redis's compact encoding.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from presence import domain
from presence.conf import PresenceSettings

#: score = seconds * SCORE_FACTOR + flags (device mask, FLAG_IDLE, FLAG_CONNECTED)
SCORE_FACTOR = 32
# Score flags (low bits of a score, above the device mask, which is below DEVICE_MASK_LIMIT):
FLAG_IDLE = 8
FLAG_CONNECTED = 16
DEVICE_MASK_LIMIT = domain.DEVICE_MASK_LIMIT


def decode_score(score: float | str | None) -> domain.LiveState:
    if score is None:
        return domain.LiveState()
    value = int(float(score))
    signed_off = value < 0
    seconds, flags = divmod(abs(value), SCORE_FACTOR)
    return domain.LiveState(
        last_active=float(seconds),
        devices=domain.devices_from_mask(flags % domain.DEVICE_MASK_LIMIT),
        signed_off=signed_off,
        connected=not signed_off and bool(flags & FLAG_CONNECTED),
        idle=bool(flags & FLAG_IDLE),
    )


class KeyScheme:
    """The keys of one site's presence (``KEY_PREFIX``, ``BUCKETS``)."""

    def __init__(self, conf: PresenceSettings) -> None:
        self.conf = conf

    def bucket_of(self, user_id: int) -> int:
        return user_id % self.conf.BUCKETS

    def seen_key(self, bucket: int) -> str:
        return f"{self.conf.KEY_PREFIX}:{{{bucket}}}:seen"

    def conns_key(self, bucket: int) -> str:
        return f"{self.conf.KEY_PREFIX}:{{{bucket}}}:conns"

    def expiries_key(self, bucket: int) -> str:
        return f"{self.conf.KEY_PREFIX}:{{{bucket}}}:expiries"

    @property
    def due_key(self) -> str:
        return f"{self.conf.KEY_PREFIX}:{{live}}:due"

    @property
    def expiring_key(self) -> str:
        return f"{self.conf.KEY_PREFIX}:{{live}}:expiring"

    def by_bucket(self, user_ids: Iterable[int]) -> dict[int, list[int]]:
        grouped: dict[int, list[int]] = defaultdict(list)
        for user_id in user_ids:
            grouped[self.bucket_of(user_id)].append(user_id)
        return grouped
