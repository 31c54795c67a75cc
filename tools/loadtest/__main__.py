"""``python -m tools.loadtest``: presence under load, with an oracle (docs/development.md).

Starts Redis (or a three-master cluster), two channel-layer Redis servers, N daphne processes
and generator processes holding real WebSocket clients; seeds a power-law population; runs the
load for a bounded time with checkpoints comparing every client's view with ``bulk_presence``;
optionally injects faults and measures a soak; prints a table and one final line:

    load: C connections, P processes, p50 X ms, p99 Y ms, lost L, wrong W, leaked K, errors E

and exits non-zero when lost, wrong, leaked or errors is above zero.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from tools.loadtest import config
from tools.loadtest.config import Sizes
from tools.loadtest.servers import Servers
from tools.processes import exit_on_sigterm


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.loadtest",
        description="A multi-process load, soak and fault test of presence with an oracle.",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small and short (CI smoke, < 60 s)")
    size.add_argument(
        "--full",
        action="store_true",
        help="the full size, named (the default: 20,000 users, 10,000 connections, 3 processes, "
        "2 generators, 60 s)",
    )
    parser.add_argument("--cluster", action="store_true", help="presence on a 3-master cluster")
    parser.add_argument("--processes", type=int, help="daphne processes (default 3; quick 2)")
    parser.add_argument("--generators", type=int, help="load generator processes (default 2)")
    parser.add_argument("--users", type=int, help="users seeded (default 20,000; quick 2,000)")
    parser.add_argument("--connections", type=int, help="WebSocket clients (default 10,000)")
    parser.add_argument("--seconds", type=float, help="seconds of load (default 60; quick 15)")
    parser.add_argument(
        "--heartbeat",
        type=int,
        help="HEARTBEAT_INTERVAL in seconds (default 2; CONNECTION_TTL is three of them)",
    )
    parser.add_argument("--soak", type=float, help="soak: run the load this many seconds")
    parser.add_argument("--faults", action="store_true", help="inject the faults during the load")
    parser.add_argument(
        "--database",
        default=os.environ.get("DATABASE_URL") or None,
        help="PostgreSQL URL (a scratch database is created beside it); default: SQLite",
    )
    parser.add_argument(
        "--layer-pool",
        type=int,
        help="diagnosis: channels_redis's connection pool size per host (default redis-py's 100)",
    )
    parser.add_argument(
        "--layer",
        choices=["core", "pubsub"],
        default="core",
        help="channels_redis layer: core (channels' default, the demo's) or pubsub (the one "
        "docs/deployment.md recommends at scale)",
    )
    parser.add_argument(
        "--storm",
        action="store_true",
        help="a reconnect storm: the first process killed and restarted once the load runs, "
        "timed until every one of its clients is back with a right view",
    )
    parser.add_argument(
        "--fault", action="append", help="with --faults: only the faults whose name has this word"
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="diagnosis: an environment variable for the daphne processes only (e.g. "
        "MALLOC_ARENA_MAX=2); repeatable",
    )
    parser.add_argument(
        "--rate",
        help="page views over sockets (reloads and tab closes) per second across all "
        "connections, or 'auto': the rate this machine carries, from what bare Channels costs "
        "here (measured first, tools/loadtest/calibrate.py); default: auto, except with --quick "
        "(the quick mix's own rate)",
    )
    parser.add_argument(
        "--timing",
        action="store_true",
        help="diagnosis: the servers time each status change's steps and their awaits "
        "(timing/<pid>.log and .calls.log in the kept logs; tools/loadtest/timing.py); off by "
        "default, so that the servers measured against bare Channels carry no instrument",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the temporary directory")
    return parser.parse_args(argv)


def scratch_postgres(url: str) -> tuple[str, str]:
    """A fresh database on the server of ``url``: (its URL, its name)."""
    name = f"presence_loadtest_{os.getpid()}"
    with _admin_connection(url) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        connection.execute(f'CREATE DATABASE "{name}"')
    base = url.rsplit("/", 1)[0]
    return f"{base}/{name}", name


def drop_postgres(url: str, name: str) -> None:
    with _admin_connection(url) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _admin_connection(url: str) -> Any:
    """An autocommit connection to the database ``url`` names (to create or drop another)."""
    import dj_database_url
    import psycopg

    conf = dj_database_url.parse(url)
    return psycopg.connect(
        host=conf["HOST"] or "127.0.0.1",
        port=int(conf["PORT"] or 5432),
        user=conf["USER"],
        password=conf["PASSWORD"] or None,
        dbname=conf["NAME"],
        autocommit=True,
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    sizes = Sizes.for_mode(args.quick).replace(
        processes=args.processes,
        generators=args.generators,
        users=args.users,
        connections=args.connections,
        seconds=args.soak or args.seconds,
    )
    if args.heartbeat:
        config.set_heartbeat(args.heartbeat)
    if sizes.connections > sizes.users * 2:
        raise SystemExit("--connections may be at most twice --users")
    work = Path(tempfile.mkdtemp(prefix="presence-loadtest-"))
    servers = Servers(sizes.processes, args.cluster, work)
    scratch: tuple[str, str] | None = None
    keep = args.keep_logs
    try:
        if args.database:
            scratch = scratch_postgres(args.database)
            database = scratch[0]
        else:
            database = str(work / "loadtest.sqlite3")
        print(f"loadtest: working directory {work}", flush=True)
        servers.start_redis()
        env = servers.env(database, json.dumps(config.presence_settings()))
        env["LOADTEST_SIGNALS_DIR"] = str(work / "signals")  # tools/loadtest/signals.py
        if args.timing:
            env["LOADTEST_TIMING_DIR"] = str(work / "timing")  # tools/loadtest/timing.py
        if args.layer_pool:
            env["LOADTEST_LAYER_POOL"] = str(args.layer_pool)
        env["LOADTEST_LAYER"] = args.layer
        for assignment in args.server_env:
            name, equals, value = assignment.partition("=")
            if not equals or not name:
                raise SystemExit(f"--server-env takes NAME=VALUE, not {assignment!r}")
            env[name] = value
        os.environ.update(
            {
                key: value
                for key, value in env.items()
                if key.startswith(("LOADTEST_", "DJANGO_"))
                and key not in ("LOADTEST_APPLICATION", "LOADTEST_MEMORY_DIR")
            }
        )
        # The harness's own log records (its announcements during faults) go to a file.
        os.environ["LOADTEST_HARNESS_LOG"] = str(work / "harness.log")
        from tools.loadtest.run import Run

        run = Run(args, sizes, servers, env, work)
        code = run.execute()
        keep = keep or code != 0
        return code
    finally:
        servers.stop()
        if scratch:
            try:
                from django.db import connections

                connections.close_all()
            except Exception:
                pass
            drop_postgres(args.database, scratch[1])
        if keep:
            print(f"loadtest: logs kept in {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    exit_on_sigterm()
    multiprocessing.set_start_method("spawn")
    random.seed(7)
    sys.exit(main(sys.argv[1:]))
