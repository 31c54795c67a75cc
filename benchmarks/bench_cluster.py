"""Presence on a three-master Redis Cluster vs one Redis, side by side in one run.

Starts its own cluster (tools/redis_cluster.py) beside the run's Redis (REDIS_URL) and measures,
with the same store code on both:

- a batch read of 5,000 ids (the Redis part of ``bulk_presence`` / ``online_friends``): client
  time, and round trips per master (goal: one);
- a touch: commands and round trips per operation (goal: equal on both);
- the spread of keys and commands over the masters while users come online (goal: max/mean
  ≤ 1.2);
- an empty sweep (every shard's schedules visited);
- memory per online user in the buckets (MEMORY USAGE over the keys, as ``memory`` measures on
  one Redis; goal ≤ 20 B).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

from benchmarks.common import (
    Report,
    Sizes,
    activity_scores,
    fill_buckets,
    median,
    raw_client,
    say,
    scan_keys,
)
from presence.conf import PresenceSettings
from presence.domain import Device
from presence.store import PresenceStore, merge
from tools.redis_cluster import RedisCluster

NAME = "cluster"
READ_IDS = 5_000


def _calls(client: redis.Redis) -> Counter[str]:
    stats: dict[str, Any] = client.info("commandstats")
    return Counter(
        {
            name.removeprefix("cmdstat_"): int(value["calls"])
            for name, value in stats.items()
            if name not in {"cmdstat_info", "cmdstat_cluster|slots", "cmdstat_cluster|nodes"}
        }
    )


def _used_memory(server: redis.Redis) -> int:
    return int(server.info("memory")["used_memory"])


def _usec(server: redis.Redis) -> int:
    """Redis time spent in commands (INFO commandstats), the scripts' own included once."""
    stats: dict[str, Any] = server.info("commandstats")
    return sum(
        int(stats[name]["usec"]) for name in ("cmdstat_evalsha", "cmdstat_zadd") if name in stats
    )


def run(sizes: Sizes, report: Report) -> None:
    users = 200_000 if sizes.population >= 1_000_000 else 20_000
    runs = max(5, sizes.friends_runs)
    say(f"\n== cluster: 3 masters vs one Redis, {users:,} online users ==")
    with RedisCluster(masters=3) as cluster:
        masters = [redis.Redis(port=port) for port in cluster.master_ports()]
        single = raw_client()
        single.flushdb()
        stores = {
            "one Redis": PresenceStore(PresenceSettings()),
            "cluster": PresenceStore(PresenceSettings(REDIS_CLUSTER=tuple(cluster.urls))),
        }
        servers = {"one Redis": [single], "cluster": masters}
        now = int(time.time())
        try:
            # Users come online: one touch each, 1,000 per plan (one round trip per master).
            spread: dict[str, Counter[int]] = {}
            for name, store in stores.items():
                before = [_calls(s) for s in servers[name]]
                for start in range(1, users + 1, 1000):
                    chunk = range(start, min(start + 1000, users + 1))
                    store.run(merge([store.plans.touch(u, Device.WEB, now) for u in chunk]))
                after = [_calls(s) for s in servers[name]]
                spread[name] = Counter(
                    {
                        i: sum((a - b).values())
                        for i, (a, b) in enumerate(zip(after, before, strict=True))
                    }
                )
            commands = spread["cluster"]
            keys = [m.dbsize() for m in masters]
            mean_calls = sum(commands.values()) / len(commands)
            calls_ratio = max(commands.values()) / mean_calls
            keys_ratio = max(keys) / (sum(keys) / len(keys))
            say(f"  commands per master {dict(commands)}; keys per master {keys}")
            report.add(
                NAME,
                "commands per master, max/mean",
                f"{calls_ratio:.2f}",
                "≤ 1.2",
                calls_ratio <= 1.2,
            )
            report.add(
                NAME, "keys per master, max/mean", f"{keys_ratio:.2f}", "≤ 1.2", keys_ratio <= 1.2
            )

            # One touch: commands and round trips.
            per_touch: dict[str, tuple[int, int]] = {}
            for name, store in stores.items():
                before = [_calls(s) for s in servers[name]]
                trips_before = sum(store.cluster.round_trips.values()) if store.cluster else 0
                store.run(store.plans.touch(users + 1, Device.WEB, now))
                after = [_calls(s) for s in servers[name]]
                # the touch script's own ZSCORE/ZADD run inside EVALSHA: count what was sent
                sent = (
                    sum(
                        (a["evalsha"] - b["evalsha"]) + (a["zadd"] - b["zadd"])
                        for a, b in zip(after, before, strict=True)
                    )
                    - 1
                )
                trips = (
                    sum(store.cluster.round_trips.values()) - trips_before if store.cluster else 1
                )
                per_touch[name] = (sent, trips)
            say(f"  per touch (commands sent, round trips): {per_touch}")
            report.add(
                NAME,
                "touch: commands, round trips (one Redis / cluster)",
                f"{per_touch['one Redis']} / {per_touch['cluster']}",
                "equal",
                per_touch["one Redis"] == per_touch["cluster"],
            )

            # A batch read of 5,000 ids: every state (bulk_presence), and only the users who
            # may be live (online_friends' READ_RECENT scripts, one per shard on the cluster).
            ids = list(range(1, READ_IDS + 1))
            reads: dict[str, Callable[[PresenceStore], Any]] = {
                "read": lambda store: store.plans.read(ids),
                "read_recent": lambda store: store.plans.read_recent(ids, now - 300),
            }
            for label, plan_of in reads.items():
                times: dict[str, float] = {}
                for name, store in stores.items():
                    store.run(plan_of(store))  # warm connections, load the script
                    samples = []
                    for _ in range(runs):
                        if store.cluster:
                            store.cluster.round_trips.clear()
                        started = time.perf_counter()
                        states = store.run(plan_of(store))
                        samples.append(time.perf_counter() - started)
                        assert states is not None and len(states) == READ_IDS
                    times[name] = median(samples)
                trips_per_master = dict(stores["cluster"].cluster.round_trips)  # type: ignore[union-attr]
                ratio = times["cluster"] / times["one Redis"]
                report.add(
                    NAME,
                    f"{label} of {READ_IDS:,} ids: round trips per master",
                    f"{sorted(trips_per_master.values())}",
                    "1 each",
                    set(trips_per_master.values()) == {1},
                )
                report.add(
                    NAME,
                    f"{label} of {READ_IDS:,} ids: cluster / one Redis (median)",
                    f"{times['cluster'] * 1000:.2f} / {times['one Redis'] * 1000:.2f} ms = "
                    f"{ratio:.2f}x",
                    "≤ 1.5x",
                    ratio <= 1.5,
                )

            # An empty sweep: every shard's schedules (256 on the cluster, 1 pair on one Redis).
            sweeps: dict[str, float] = {}
            for name, store in stores.items():
                store.run(store.plans.claim_due(now - 10_000, 500))
                samples = []
                for _ in range(runs):
                    started = time.perf_counter()
                    store.run(store.plans.claim_due(now - 10_000, 500))
                    samples.append(time.perf_counter() - started)
                sweeps[name] = median(samples)
            report.add(
                NAME,
                "empty sweep: cluster / one Redis (median)",
                f"{sweeps['cluster'] * 1000:.2f} / {sweeps['one Redis'] * 1000:.2f} ms",
            )

            # Capacity inputs: Redis memory per connected user (one WebSocket each: seen,
            # connection, expiry and due entries) and Redis time per heartbeat script (the due
            # ZADD beside it is ~1 µs), on both: docs/deployment.md's capacity table uses them.
            connected = users
            capacity: dict[str, tuple[float, float]] = {}
            for name, store in stores.items():
                for server in servers[name]:
                    server.flushall()
                memory_before = sum(_used_memory(server) for server in servers[name])
                for start in range(1, connected + 1, 500):
                    chunk = range(start, min(start + 500, connected + 1))
                    store.run(merge([store.plans.connection(u, "open", now, "c1") for u in chunk]))
                    store.run(merge([store.plans.connected(u, now) for u in chunk]))
                grown = sum(_used_memory(server) for server in servers[name]) - memory_before
                usec_before = sum(_usec(server) for server in servers[name])
                for start in range(1, connected + 1, 500):
                    chunk = range(start, min(start + 500, connected + 1))
                    store.run(
                        merge([store.plans.connection(u, "beat", now + 30, "c1") for u in chunk])
                    )
                usec = sum(_usec(server) for server in servers[name]) - usec_before
                capacity[name] = (grown / connected, usec / connected)
            for name, (per_user, per_beat) in capacity.items():
                report.add(
                    NAME,
                    f"{name}: Redis bytes per connected user, µs per heartbeat script",
                    f"{per_user:.0f} B, {per_beat:.1f} µs",
                )

            # Memory per online user in the buckets, as bench_memory measures it.
            for master in masters:
                master.flushall()
            cluster_store = stores["cluster"]
            population = sizes.population  # as bench_memory: ~61 users per bucket at full size
            scores = activity_scores(range(1, population + 1), now, spread=300)
            fill_buckets(cluster_store.client, cluster_store, scores, commands_per_round_trip=500)
            total = 0
            for master in masters:
                for key in scan_keys(master, "presence:*"):
                    total += int(master.execute_command("MEMORY USAGE", key, "SAMPLES", 0))
            per_user = total / population
            report.add(
                NAME,
                f"bytes per online user on the cluster, {population:,} users (MEMORY USAGE)",
                f"{per_user:.1f}",
                "≤ 20",
                per_user <= 20,
            )
        finally:
            for store in stores.values():
                store.close()
            for server in [single, *masters]:
                server.close()
