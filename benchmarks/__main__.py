"""``python -m benchmarks [--quick] [NAME ...]`` — run the benchmarks and print a summary.

Needs REDIS_URL pointing at a Redis whose database may be flushed (``make bench`` starts a
throwaway one). The database is a fresh SQLite file in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tools.processes import exit_on_sigterm

if TYPE_CHECKING:
    from benchmarks.common import Row

NAMES = (
    "middleware",
    "online_friends",
    "memory",
    "cleanup",
    "feed",
    "fanout",
    "heartbeats",
    "connections",
    "user_connections",
    "cluster",
    "amplification",
    "page_views",
    "rooms",
    "metrics",
    "online_count",
    "admission_flood",
    "guest_count",
    "join_flood",
    "room_rules",
    "rooms_peers",
    "hub_intake",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"benchmarks to run (default: all): {NAMES}"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke check")
    parser.add_argument(
        "--postgres",
        metavar="URL",
        default=os.environ.get("BENCH_POSTGRES_URL") or None,
        help="also run the feed benchmark on this PostgreSQL database, which it empties "
        "(default: $BENCH_POSTGRES_URL)",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in NAMES]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(NAMES)}")
    return args


def setup(db_dir: str, postgres: str | None = None) -> None:
    os.environ["BENCH_DB_DIR"] = db_dir
    if postgres:
        os.environ["BENCH_POSTGRES_URL"] = postgres
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    for alias in settings.DATABASES:
        connection = connections[alias]
        if connection.vendor == "postgresql":
            # The feed benchmark's own databases: create them when missing.
            name = connection.settings_dict["NAME"]
            with connection._nodb_cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
                if cursor.fetchone() is None:
                    cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")
        call_command("migrate", verbosity=0, interactive=False, database=alias)
    from benchmarks.common import number_users_from

    # Users the database numbers (page_views', ...) land past every benchmark's own ids.
    number_users_from()


def summary(rows: list[Row], quick: bool, elapsed: float) -> None:
    headers = ("benchmark", "metric", "value", "goal", "")
    table = [
        (
            r.benchmark,
            r.metric,
            r.value,
            r.goal,
            "" if r.passed is None else ("PASS" if r.passed else "MISS"),
        )
        for r in rows
    ]
    widths = [max(len(str(row[i])) for row in [headers, *table]) for i in range(len(headers))]
    line = "  ".join("-" * w for w in widths)
    title = " (--quick: small sizes; goals are judged at full size only)" if quick else ""
    print(f"\n== summary{title} ==")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print(line)
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(line)
    goals = [r for r in rows if r.passed is not None]
    passed = sum(1 for r in goals if r.passed)
    verdict = f"{passed}/{len(goals)} goals met; " if goals else ""
    print(f"{verdict}total run time {elapsed:.0f} s")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from benchmarks.common import (
        Report,
        Sizes,
        cpu_pressure_us,
        raw_client,
        redis_url,
        reference_loop_seconds,
        say,
    )

    redis_url()  # fail early with a helpful message
    started = time.perf_counter()
    db_dir = tempfile.mkdtemp(prefix="presence-bench-")
    try:
        setup(db_dir, args.postgres)
        from benchmarks import (
            bench_admission_flood,
            bench_amplification,
            bench_cleanup,
            bench_cluster,
            bench_connections,
            bench_fanout,
            bench_feed,
            bench_guest_count,
            bench_heartbeats,
            bench_hub_intake,
            bench_join_flood,
            bench_memory,
            bench_metrics,
            bench_middleware,
            bench_online_count,
            bench_online_friends,
            bench_page_views,
            bench_room_rules,
            bench_rooms,
            bench_rooms_peers,
            bench_user_connections,
        )

        runners: dict[str, Callable[[Sizes, Report], None]] = {
            "middleware": bench_middleware.run,
            "online_friends": bench_online_friends.run,
            "memory": bench_memory.run,
            "cleanup": bench_cleanup.run,
            "feed": bench_feed.run,
            "fanout": bench_fanout.run,
            "heartbeats": bench_heartbeats.run,
            "connections": bench_connections.run,
            "user_connections": bench_user_connections.run,
            "cluster": bench_cluster.run,
            "amplification": bench_amplification.run,
            "page_views": bench_page_views.run,
            "rooms": bench_rooms.run,
            "metrics": bench_metrics.run,
            "online_count": bench_online_count.run,
            "admission_flood": bench_admission_flood.run,
            "guest_count": bench_guest_count.run,
            "join_flood": bench_join_flood.run,
            "room_rules": bench_room_rules.run,
            "rooms_peers": bench_rooms_peers.run,
            "hub_intake": bench_hub_intake.run,
        }
        client = raw_client(decode=True)
        server = client.info("server")
        client.close()
        sizes = Sizes.for_mode(args.quick)
        print(
            f"Redis {server['redis_version']} ({redis_url()}), Python {platform.python_version()}"
            f", {os.cpu_count()} CPUs, SQLite in {db_dir}; {'quick' if args.quick else 'full'} run",
            flush=True,
        )
        print(
            f"Machine speed: a reference loop of 10M additions takes "
            f"{reference_loop_seconds():.2f} s (a rough guide to how fast this machine is)",
            flush=True,
        )
        report = Report(quick=args.quick)
        for name in args.names or NAMES:
            # Other processes competing for the CPUs distort wall-clock figures: say how much.
            pressure, start = cpu_pressure_us(), time.perf_counter()
            runners[name](sizes, report)
            after, took = cpu_pressure_us(), time.perf_counter() - start
            machine = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
            if pressure is not None and after is not None:
                share = (after - pressure) / 1e6 / took
                machine = f"some task waited for a CPU {share:.0%} of its time; {machine}"
            say(f"  ({name} took {took:.0f} s; machine: {machine})")
        summary(report.rows, args.quick, time.perf_counter() - started)
    finally:
        shutil.rmtree(db_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    # A stopped run (make bench under a timeout, a kill) still stops what it started: each
    # benchmark's finally blocks stop its daphne and clients, and the database goes.
    exit_on_sigterm()
    sys.exit(main(sys.argv[1:]))
