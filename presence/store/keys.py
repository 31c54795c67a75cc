"""The key scheme and the score encoding: where each piece of presence lives in Redis.

See docs/redis-layout.md. On one Redis every key of a user's live state carries its bucket as
the hash tag (``{KEY_PREFIX}:{<bucket>}:...``) and the two schedules are single keys
(``{KEY_PREFIX}:{live}:due``, ``:expiring``).

On a Redis Cluster (``REDIS_CLUSTER``) the buckets are grouped into ``CLUSTER_SHARDS`` shards:
a bucket's keys carry its shard's tag (``{KEY_PREFIX}:{<tag>}:<bucket>:seen``) and every shard
has its own schedules (``{KEY_PREFIX}:{<tag>}:due``), so a user's keys and due times share one
slot (one round trip for every write) and nothing global sits in one slot. The shards' tags are
chosen so that their slots are evenly spaced over the 16,384 slots (:func:`shard_tags`): masters
holding equal slot ranges hold equal numbers of shards.
"""

from __future__ import annotations

import binascii
import math
from collections.abc import Iterable
from functools import cache
from itertools import groupby

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from presence import domain
from presence.conf import PresenceSettings
from presence.memo import bounded_memo
from presence.users import UserId, encode_id

#: score = seconds * SCORE_FACTOR + flags (device mask, FLAG_IDLE, FLAG_CONNECTED)
SCORE_FACTOR = 32
# Score flags (low bits of a score, above the device mask, which is below DEVICE_MASK_LIMIT):
FLAG_IDLE = 8
FLAG_CONNECTED = 16
DEVICE_MASK_LIMIT = domain.DEVICE_MASK_LIMIT
#: seconds an emptied room keeps ``:z`` (the latest end of a stay its sweep pruned): a join whose
#: time was taken before the room emptied and that runs within them is still ordered after
#: those stays (lua/room_common.lua); far past the store's timeouts
ROOM_Z_KEEP = 120


def expiry_score(ends: float) -> int:
    """A custom status's score in the expiring schedule: the second after it ends (claims compare
    whole seconds, due <= int(now))."""
    return int(ends) + 1


def decode_score(score: float | str | None) -> domain.LiveState:
    if score is None:
        return domain.LiveState()
    # An integer from a script's reply as it is; a ZSCORE-style reply is a float or its text.
    return _decode_value(score if isinstance(score, int) else int(float(score)))


# Users active within the same second share a score: thousands of friends read at once decode
# to far fewer distinct states (LiveState is immutable, so one instance serves them all).
@bounded_memo(8192)
def _decode_value(value: int) -> domain.LiveState:
    signed_off = value < 0
    seconds, flags = divmod(abs(value), SCORE_FACTOR)
    return domain.LiveState(
        last_active=float(seconds),
        devices=domain.devices_from_mask(flags % domain.DEVICE_MASK_LIMIT),
        signed_off=signed_off,
        connected=not signed_off and bool(flags & FLAG_CONNECTED),
        idle=bool(flags & FLAG_IDLE),
    )


def _golden_stride(shards: int) -> int:
    """A step coprime with ``shards`` near 0.618 of it: consecutive shards land far apart."""
    stride = max(1, round(shards * 0.6180339887))
    while math.gcd(stride, shards) != 1:
        stride += 1
    return stride


@cache
def shard_tags(shards: int) -> tuple[str, ...]:
    """The hash tag of each of ``shards`` shards.

    The 16,384 slots are cut into ``shards`` equal ranges; each range's tag is the first ``s<n>``
    (n = 0, 1, ...) whose slot lies in it, so the shards' slots are evenly spaced and masters
    holding equal slot ranges hold equal numbers of shards. Shard ``i`` takes range
    ``i * stride % shards`` (a golden-ratio step), so consecutive shards, and the users of
    consecutive ids, fall on different masters. Deterministic: every process agrees.
    """
    shards = max(1, min(shards, REDIS_CLUSTER_HASH_SLOTS))
    by_range: list[str | None] = [None] * shards
    missing = shards
    n = 0
    while missing:
        tag = f"s{n}"
        index = key_slot(tag.encode()) * shards // REDIS_CLUSTER_HASH_SLOTS
        if by_range[index] is None:
            by_range[index] = tag
            missing -= 1
        n += 1
    stride = _golden_stride(shards)
    return tuple(str(by_range[i * stride % shards]) for i in range(shards))


class KeyScheme:
    """The keys of one site's presence (``KEY_PREFIX``, ``BUCKETS``, and on a cluster
    ``CLUSTER_SHARDS``)."""

    def __init__(self, conf: PresenceSettings) -> None:
        self.conf = conf
        self.clustered = bool(conf.REDIS_CLUSTER)
        self.tags = shard_tags(conf.CLUSTER_SHARDS) if self.clustered else ("live",)
        self._seen_keys: dict[int, str] = {}
        self._prior_keys: dict[int, str] = {}

    def bucket_of(self, user_id: UserId) -> int:
        """The one source of a user's bucket: an integer id modulo BUCKETS, any other id by the
        CRC-32 of its canonical form (the same in every process, unlike ``hash()``)."""
        if isinstance(user_id, int):
            return user_id % self.conf.BUCKETS
        member = str(encode_id(user_id)).encode("utf-8", "surrogatepass")
        return binascii.crc32(member) % self.conf.BUCKETS

    def shard_of(self, bucket: int) -> int:
        return bucket % len(self.tags)

    def _bucket_base(self, bucket: int) -> str:
        if self.clustered:
            return f"{self.conf.KEY_PREFIX}:{{{self.tags[self.shard_of(bucket)]}}}:{bucket}"
        return f"{self.conf.KEY_PREFIX}:{{{bucket}}}"

    def seen_key(self, bucket: int) -> str:
        # Kept once made (at most BUCKETS of each): a subscribe's snapshot names a seen and a
        # prior key for each of its users' buckets, a hundred strings per page view.
        key = self._seen_keys.get(bucket)
        if key is None:
            key = self._seen_keys[bucket] = f"{self._bucket_base(bucket)}:seen"
        return key

    def closes_channel(self) -> str:
        """The pub/sub channel where a user's last connection going is published
        (lua/connection.lua), for the page views' throttles (presence.closes)."""
        return f"{self.conf.KEY_PREFIX}:closes"

    def prior_key(self, bucket: int) -> str:
        """The bucket's last seen before today's (lua/prior.lua): user -> the last seen of an
        earlier UTC day that today's activity replaced (the approximate last seen's base)."""
        key = self._prior_keys.get(bucket)
        if key is None:
            key = self._prior_keys[bucket] = f"{self._bucket_base(bucket)}:prior"
        return key

    def conns_key(self, bucket: int) -> str:
        return f"{self._bucket_base(bucket)}:conns"

    def expiries_key(self, bucket: int) -> str:
        return f"{self._bucket_base(bucket)}:expiries"

    def _schedule_key(self, shard: int, name: str) -> str:
        return f"{self.conf.KEY_PREFIX}:{{{self.tags[shard]}}}:{name}"

    def due_key(self, bucket: int) -> str:
        """The schedule of users due to turn offline, for the users of this bucket."""
        return self._schedule_key(self.shard_of(bucket), "due")

    def expiring_key(self, bucket: int) -> str:
        """The schedule of custom statuses due to expire, for the users of this bucket."""
        return self._schedule_key(self.shard_of(bucket), "expiring")

    def shard_expiring_key(self, shard: int) -> str:
        """The shard's schedule of custom statuses due to expire."""
        return self._schedule_key(shard, "expiring")

    def lease_key(self, shard: int) -> str:
        """The users a sweeper claimed from the shard's "due" schedule, by when the claim lapses."""
        return self._schedule_key(shard, "leased")

    def changes_key(self, shard: int) -> str:
        """When each of the shard's users' visible presence last changed (presence.stamps), in
        the slot of its schedules, which a reader of stamps reads in the same script."""
        return self._schedule_key(shard, "changes")

    def changes_epoch_key(self, shard: int) -> str:
        """Since when the shard's change stamps are all kept (absent after a flush)."""
        return self._schedule_key(shard, "changes:epoch")

    def ledger_keys(self, shard: int) -> tuple[str, str, str]:
        """The shard's online ledger (lua/ledger.lua): the visible users online and the hidden
        ones, by the time each turns offline, and the users who chose to be invisible."""
        return (
            self._schedule_key(shard, "online"),
            self._schedule_key(shard, "hidden"),
            self._schedule_key(shard, "invisible"),
        )

    def user_ledger_keys(self, user_id: UserId) -> tuple[str, str, str]:
        return self.ledger_keys(self.shard_of(self.bucket_of(user_id)))

    def seeded_key(self, shard: int) -> str:
        """Set once the shard's invisible set and expiring schedule were seeded from the
        database (lua/seed_ledger.lua), to the run of the server that seeded them (INFO's
        run_id); absent after Redis lost them, of another run after a restart or a failover
        (lua/ledger.lua's ``seeded``). Named after the invisible set, as the scripts name it
        (with ``:touched``, the users written while not seeded, and ``:seeding``, the users a
        seed under way listed)."""
        return f"{self.ledger_keys(shard)[2]}:seeded"

    def user_seeded_key(self, user_id: UserId) -> str:
        return self.seeded_key(self.shard_of(self.bucket_of(user_id)))

    def seed_keys(self, shard: int) -> tuple[str, str, str]:
        """The shard's ``:seeded`` marker, ``:touched`` and ``:seeding`` sets (see
        :meth:`seeded_key`): the ledger's scripts take them in their KEYS, never build them, so
        that on a cluster a slot migrating is answered TRYAGAIN or ASK before a script writes
        (a key built in Lua that moved stops the script half-way)."""
        invisible = self.ledger_keys(shard)[2]
        return (f"{invisible}:seeded", f"{invisible}:touched", f"{invisible}:seeding")

    def shard_of_user(self, user_id: UserId) -> int:
        return self.shard_of(self.bucket_of(user_id))

    def outbox_key(self, shard: int) -> str:
        """The shard's outbox (lua/ledger.lua): the transitions made whose signal nobody has
        claimed yet (presence.outbox)."""
        return self._schedule_key(shard, "outbox")

    def user_outbox_key(self, user_id: UserId) -> str:
        return self.outbox_key(self.shard_of(self.bucket_of(user_id)))

    def shards(self) -> range:
        return range(len(self.tags))

    def user_due_key(self, user_id: UserId) -> str:
        return self.due_key(self.bucket_of(user_id))

    def user_expiring_key(self, user_id: UserId) -> str:
        return self.expiring_key(self.bucket_of(user_id))

    def schedules(self) -> list[tuple[str, str]]:
        """Every shard's (due, expiring) schedule keys (one pair on one Redis)."""
        return [
            (self._schedule_key(shard, "due"), self._schedule_key(shard, "expiring"))
            for shard in range(len(self.tags))
        ]

    # --- guests (presence.store.plans.guests) ---

    def guest_bucket_seconds(self) -> int:
        """The length of a guest bucket: a tenth of ONLINE_WINDOW (at least a second), so a
        count reads 10 or 11 buckets and is exact to a tenth of the window."""
        return max(1, math.ceil(self.conf.ONLINE_WINDOW / 10))

    def guest_key(self, bucket: int) -> str:
        """The HyperLogLog of the anonymous visitors seen in guest bucket ``bucket`` (seconds
        since the epoch // the bucket's length). One hash tag for all of them: a count reads
        them with one multi-key PFCOUNT, which a cluster allows only within one slot."""
        return f"{self.conf.KEY_PREFIX}:{{guests}}:{bucket}"

    # --- rooms (presence.store.plans.rooms) ---

    def room_key(self, room: str, part: str) -> str:
        """A key of the room ``kind:id``: every key of one room carries the room as its hash tag
        (one slot; a room's scripts run there). ``part``: ``n`` the room's summary (its
        scripts build the other parts from it: segments ``s:<k>``, index buckets ``u:<b>``,
        ``g``, ``w``, ``e``, ``t``, ``v``; lua/room_common.lua)."""
        return f"{self.conf.KEY_PREFIX}:{{room:{room}}}:{part}"

    def room_schedule_key(self, room: str) -> str:
        """The schedule of rooms due to be swept (members whose stay ended), for this room."""
        member = room.encode("utf-8", "surrogatepass")
        return self._schedule_key(binascii.crc32(member) % len(self.tags), "rooms")

    def room_schedules(self) -> list[str]:
        """Every shard's room schedule (one on one Redis)."""
        return [self._schedule_key(shard, "rooms") for shard in range(len(self.tags))]

    def by_bucket(self, user_ids: Iterable[UserId]) -> list[tuple[int, tuple[UserId, ...]]]:
        """Each bucket holding one of these users, with those users, in bucket order.

        Sorted and grouped, with a tuple per bucket: a read of thousands of friends used to
        build a list per bucket, thousands of objects for the garbage collector to walk."""
        buckets = self.conf.BUCKETS
        # Each user's bucket computed once (a CRC-32 for a string or UUID id), sorted and
        # grouped by it; bucket_of's rule, inlined for integer ids (thousands at a time).
        bucket = {
            user_id: user_id % buckets if type(user_id) is int else self.bucket_of(user_id)
            for user_id in user_ids
        }
        of = bucket.__getitem__
        return [(b, tuple(members)) for b, members in groupby(sorted(bucket, key=of), key=of)]
