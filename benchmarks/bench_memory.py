"""Redis memory per online user: presence's buckets (integer ids, and the same users keyed by
UUIDs) vs one global sorted set of the same users.

Each layout is measured two ways: the sum of ``MEMORY USAGE key SAMPLES 0`` over its keys (exact
per-key accounting, keys found with SCAN MATCH on the prefix), and the growth of the server's
``used_memory`` while writing it (includes the keyspace's hash table, which MEMORY USAGE leaves
out).
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from typing import Any

import redis

from benchmarks.common import (
    Report,
    Sizes,
    activity_scores,
    fill_buckets,
    fill_single_set,
    flush,
    presence_sorted_sets,
    raw_client,
    say,
    store,
)

NAME = "memory"
SINGLE = "bench:online"


def used_memory(client: redis.Redis) -> int:
    info: dict[str, Any] = client.info("memory")
    return int(info["used_memory"])


def memory_usage(client: redis.Redis, keys: list[Any]) -> tuple[int, Counter[str]]:
    total = 0
    encodings: Counter[str] = Counter()
    for start in range(0, len(keys), 1000):
        chunk = keys[start : start + 1000]
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.execute_command("MEMORY USAGE", key, "SAMPLES", 0)
            pipe.object("encoding", key)
        replies = pipe.execute()
        total += sum(int(r) for r in replies[::2])
        encodings.update(e.decode() if isinstance(e, bytes) else str(e) for e in replies[1::2])
    return total, encodings


def uuid_ids(n: int, seed: int = 3) -> list[uuid.UUID]:
    """``n`` random (version 4) UUIDs, the same every run."""
    rnd = random.Random(seed)
    return [uuid.UUID(int=rnd.getrandbits(128), version=4) for _ in range(n)]


def measure_buckets(
    client: redis.Redis, s: Any, scores: dict[Any, int], label: str
) -> tuple[int, int, list[int]]:
    """Write ``scores`` into the buckets as presence does: (MEMORY USAGE total, used_memory
    growth, users per key)."""
    flush(client)
    before = used_memory(client)
    fill_buckets(client, s, scores)
    grown = used_memory(client) - before
    keys = presence_sorted_sets(client, s)
    total, encodings = memory_usage(client, keys)
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.zcard(key)
    sizes_of = pipe.execute()
    if sum(sizes_of) != len(scores):
        raise RuntimeError(f"expected {len(scores)} members in the buckets, found {sum(sizes_of)}")
    say(
        f"  buckets, {label}: {len(keys):,} keys, {min(sizes_of)}..{max(sizes_of)} users per "
        f"key, encodings {dict(encodings)}; MEMORY USAGE {total:,} B; used_memory grew {grown:,} B"
    )
    return total, grown, sizes_of


def run(sizes: Sizes, report: Report) -> None:
    n = sizes.population
    say(f"\n== memory: {n:,} online users ==")
    client = raw_client()
    s = store()
    now = int(time.time())
    scores = activity_scores(range(1, n + 1), now, spread=s.conf.ONLINE_WINDOW)
    total, grown, sizes_of = measure_buckets(client, s, scores, "integer ids")
    # The same users keyed by UUIDs: members are their 36-character text, buckets by CRC-32.
    uuid_scores = dict(zip(uuid_ids(n), scores.values(), strict=True))
    uuid_total, uuid_grown, uuid_sizes = measure_buckets(client, s, uuid_scores, "UUID ids")

    flush(client)
    before = used_memory(client)
    fill_single_set(client, SINGLE, scores)
    single_grown = used_memory(client) - before
    single_total, single_encoding = memory_usage(client, [SINGLE])
    say(
        f"  one sorted set: encoding {dict(single_encoding)}; MEMORY USAGE {single_total:,} B; "
        f"used_memory grew {single_grown:,} B"
    )
    config: dict[str, Any] = dict(client.config_get("zset-max-ziplist-entries"))  # type: ignore[arg-type]
    limit = config["zset-max-ziplist-entries"]
    flush(client)
    client.close()

    per_user = total / n
    report.add(
        NAME,
        "bytes per online user, buckets (MEMORY USAGE)",
        f"{per_user:.1f}",
        "≤ 100",
        per_user <= 100,
    )
    report.add(NAME, "bytes per online user, buckets (used_memory growth)", f"{grown / n:.1f}")
    uuid_per_user = uuid_total / n
    report.add(
        NAME,
        "bytes per online user, buckets, UUID ids (MEMORY USAGE)",
        f"{uuid_per_user:.1f} ({uuid_per_user / per_user:.1f}x integer ids)",
        "≤ 100",
        uuid_per_user <= 100,
    )
    report.add(
        NAME,
        "bytes per online user, buckets, UUID ids (used_memory growth)",
        f"{uuid_grown / n:.1f}",
    )
    report.add(
        NAME,
        "bytes per online user, one sorted set (MEMORY USAGE)",
        f"{single_total / n:.1f} ({single_total / total:.1f}x ours)",
    )
    report.add(
        NAME,
        f"largest bucket (compact encoding up to {int(limit)})",
        f"{max(sizes_of)} users (UUID ids: {max(uuid_sizes)})",
    )
