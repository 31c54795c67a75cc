"""Shared pieces: sizes, result rows, timing, direct Redis access and bulk fills."""

from __future__ import annotations

import os
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis

from presence.store import SCORE_FACTOR, PresenceStore, get_store
from presence.users import encode_id
from tools.redis_server import scan_keys


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark is; ``--quick`` shrinks everything for a smoke check."""

    population: int
    friends: int
    stale: int
    middleware_rounds: int
    middleware_requests: int
    friends_runs: int
    literature_runs: int

    @classmethod
    def for_mode(cls, quick: bool) -> Sizes:
        if quick:
            return cls(
                population=100_000,
                friends=1_000,
                stale=25_000,
                middleware_rounds=10,
                middleware_requests=30,
                friends_runs=5,
                literature_runs=2,
            )
        return cls(
            population=1_000_000,
            friends=5_000,
            stale=1_000_000,
            middleware_rounds=40,
            middleware_requests=50,
            friends_runs=15,
            literature_runs=5,
        )


@dataclass
class Row:
    """One line of the summary: a figure, and its goal when it has one."""

    benchmark: str
    metric: str
    value: str
    goal: str = ""
    passed: bool | None = None


@dataclass
class Report:
    #: goals are judged at full size only: a --quick run shows them without PASS/MISS
    quick: bool = False
    rows: list[Row] = field(default_factory=list)

    def add(
        self,
        benchmark: str,
        metric: str,
        value: str,
        goal: str = "",
        passed: bool | None = None,
    ) -> None:
        if self.quick:
            passed = None
        self.rows.append(Row(benchmark, metric, value, goal, passed))
        mark = "" if passed is None else ("  [PASS]" if passed else "  [MISS]")
        goal_text = f"  (goal {goal})" if goal else ""
        print(f"  {metric}: {value}{goal_text}{mark}", flush=True)


def say(text: str) -> None:
    print(text, flush=True)


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.2f} ms"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def redis_url() -> str:
    url = os.environ.get("REDIS_URL", "")
    if not url:
        raise SystemExit(
            "REDIS_URL is not set. Run `make bench` (it starts a throwaway redis-server), or "
            "`python -m tools.redis_server -- python -m benchmarks`, or set REDIS_URL to a Redis "
            "whose database the benchmarks may flush."
        )
    return url


def raw_client(decode: bool = False) -> redis.Redis:
    """A plain client for setup and for the literature approaches (not the store's client)."""
    return redis.Redis.from_url(redis_url(), decode_responses=decode, socket_timeout=120)


#: The user ids of each benchmark: the users it writes to the database and the ids it writes to
#: Redis. One `make bench` runs them all on one database, which each leaves its users in: where
#: two overlapped, one's rows met the other's ids (the feed's invisible users were counted out
#: of the online count's, whose Redis is seeded from the database). Disjoint, and every one
#: below AUTO_IDS_FROM, where the users numbered by the database go (tests/load/
#: test_benchmarks.py checks both). The site's own users, 1..N, are those of the benchmarks of
#: a site of N users (online_friends; memory and cluster write ids 1..N to a Redis of their own
#: or a flushed one, and no row): their figures are of ids as long as a site's.
ID_RANGES: dict[str, range] = {
    "site": range(1, 2_000_001),  # online_friends, memory, cluster
    "middleware": range(3_000_001, 3_000_002),
    "user_connections": range(5_000_001, 5_100_001),
    "rooms": range(7_000_001, 7_100_001),
    "room_rules": range(8_000_001, 8_100_001),
    "rooms_peers": range(9_000_001, 9_500_001),
    "join_flood": range(9_500_001, 9_600_001),
    "cleanup": range(10_000_001, 11_000_001),
    "cleanup_online": range(11_500_001, 11_501_001),
    "fanout": range(20_000_000, 20_500_000),
    "fanout_exceptions": range(20_500_000, 20_501_002),
    "heartbeats": range(21_000_000, 22_000_000),
    "connections": range(22_000_000, 23_000_000),
    "metrics": range(23_000_000, 24_000_000),
    "feed": range(40_000_001, 50_000_001),
    "online_count": range(50_000_001, 51_000_002),
    "guest_count": range(60_000_001, 60_002_001),
    "cleanup_probe": range(90_000_000, 100_000_000),  # bucket 0's members, no rows
}
#: where the database numbers the users of the benchmarks that let it (page_views,
#: amplification, admission_flood): past every range above, whatever ran before
AUTO_IDS_FROM = 100_000_001


def number_users_from(first: int = AUTO_IDS_FROM) -> None:
    """Make the database number new users from ``first`` on (SQLite's AUTOINCREMENT numbers
    after the largest id ever written: after a benchmark's users, in the next one's range)."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    if connection.vendor != "sqlite":  # pragma: no cover - the benchmarks' database is SQLite
        raise RuntimeError(f"numbering users on {connection.vendor} is not done here")
    table = get_user_model()._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("UPDATE sqlite_sequence SET seq = %s WHERE name = %s", [first - 1, table])
        if cursor.rowcount == 0:
            cursor.execute(
                "INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [table, first - 1]
            )


def flush(client: redis.Redis) -> None:
    client.flushdb()
    client.slowlog_reset()


def encode(seconds: int, mask: int) -> int:
    """The store's score encoding (store.py docstring): seconds * 8 + device mask."""
    return seconds * SCORE_FACTOR + mask


def activity_scores(
    user_ids: Iterable[Any], now: int, spread: int, offset: int = 0, seed: int = 2
) -> dict[Any, int]:
    """Encoded scores last active uniformly in ``[now - offset - spread, now - offset]``.

    Mostly web (mask 1), some mobile and both, like a real mix of devices.
    """
    rnd = random.Random(seed)
    masks = (1, 1, 1, 2, 3)
    return {
        uid: encode(now - offset - rnd.randrange(spread + 1), masks[rnd.randrange(5)])
        for uid in user_ids
    }


def fill_buckets(
    client: redis.Redis,
    store: PresenceStore,
    scores: dict[Any, int],
    commands_per_round_trip: int = 256,
) -> None:
    """Write entries with the store's key scheme: one ZADD per bucket, pipelined. Ids of any pk
    type (an int, a UUID): the store's bucket and canonical member, as presence writes them."""
    grouped: dict[int, list[Any]] = defaultdict(list)
    for uid, score in scores.items():
        grouped[store.keys.bucket_of(uid)] += (score, encode_id(uid))
    pipe = client.pipeline(transaction=False)
    for n, (bucket, args) in enumerate(grouped.items(), 1):
        pipe.execute_command("ZADD", store.keys.seen_key(bucket), *args)
        if n % commands_per_round_trip == 0:
            pipe.execute()
    pipe.execute()


def fill_single_set(
    client: redis.Redis, key: str, scores: dict[int, int], chunk: int = 10_000
) -> None:
    """The naive layout: every user in one global sorted set."""
    items = list(scores.items())
    pipe = client.pipeline(transaction=False)
    for start in range(0, len(items), chunk):
        args: list[int] = []
        for uid, score in items[start : start + chunk]:
            args += (score, uid)
        pipe.execute_command("ZADD", key, *args)
        if (start // chunk) % 10 == 9:
            pipe.execute()
    pipe.execute()


def presence_keys(client: redis.Redis, store: PresenceStore) -> list[Any]:
    return scan_keys(client, f"{store.conf.KEY_PREFIX}:*")


def presence_sorted_sets(client: redis.Redis, store: PresenceStore) -> list[Any]:
    """presence's sorted sets (its buckets, indexes and schedules), not its other keys (a
    shard's ``:seeded`` marker, the invisible set): what holds one entry per user and time."""
    keys = presence_keys(client, store)
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    kinds = pipe.execute()
    return [key for key, kind in zip(keys, kinds, strict=True) if kind in ("zset", b"zset")]


@dataclass
class SlowEntry:
    micros: int
    command: str
    #: unix time the command started
    start: int = 0


@contextmanager
def slowlog(
    client: redis.Redis, slower_than_us: int, max_len: int = 100_000
) -> Iterator[list[SlowEntry]]:
    """Log every Redis command slower than ``slower_than_us`` while the block runs.

    Yields a list filled on exit, slowest first; restores the server's settings afterwards.
    """
    old: dict[str, Any] = dict(client.config_get("slowlog-*"))  # type: ignore[arg-type]
    entries: list[SlowEntry] = []
    client.config_set("slowlog-log-slower-than", slower_than_us)
    client.config_set("slowlog-max-len", max_len)
    client.slowlog_reset()
    try:
        yield entries
        logged = client.slowlog_len()
        if logged >= max_len:
            raise RuntimeError(f"SLOWLOG overflowed ({logged} entries): raise max_len")
        for entry in client.slowlog_get(max_len):
            command = entry["command"]
            text = command.decode(errors="replace") if isinstance(command, bytes) else command
            # Long argument lists are shortened: the name and key say what the command was.
            entries.append(
                SlowEntry(
                    int(entry["duration"]), " ".join(text.split(" ")[:2]), entry["start_time"]
                )
            )
        entries.sort(key=lambda e: e.micros, reverse=True)
    finally:
        client.slowlog_reset()
        for name, value in old.items():
            client.config_set(name, value)


def store() -> PresenceStore:
    return get_store()


def command_stats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """(calls, total microseconds) per command name, from INFO commandstats."""
    stats: dict[str, Any] = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (int(value["calls"]), int(value["usec"]))
        for name, value in stats.items()
    }


def reference_loop_seconds() -> float:
    """Seconds this machine takes for a fixed pure-Python loop (10 million additions, best of
    three): a rough guide to how fast the machine is (these machines differ by more than twice
    from one session to the next; memory-bound work varies differently)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        total = 0
        for i in range(10_000_000):
            total += i
        best = min(best, time.perf_counter() - start)
    return best


def cpu_pressure_us() -> int | None:
    """Microseconds some runnable task waited for a CPU since boot (Linux PSI), or None."""
    try:
        with open("/proc/pressure/cpu") as psi:
            some = psi.readline().split()
    except OSError:
        return None
    return int(some[-1].removeprefix("total="))
