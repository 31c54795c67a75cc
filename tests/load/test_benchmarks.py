"""The benchmarks' own checks (benchmarks/): the page-view benchmark's check of the snapshots
against ``bulk_presence``, and ``python -m benchmarks`` stopped by SIGTERM (``make bench``
under a timeout, or killed) still stopping and removing what it started."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks import (
    bench_cleanup,
    bench_connections,
    bench_fanout,
    bench_feed,
    bench_guest_count,
    bench_heartbeats,
    bench_join_flood,
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
from benchmarks.common import AUTO_IDS_FROM, ID_RANGES, Sizes
from benchmarks.page_views_client import Run
from tools.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]
PAGES = 20


async def test_the_snapshot_check_fails_when_its_page_views_fail() -> None:
    # The client's page views against a port nothing listens on: every one fails.
    port = free_port()
    rendered = [
        {"viewer": v, "cookie": "sessionid=x", "users": [1, 2], "since": "", "shown": {}}
        for v in range(PAGES)
    ]
    spec = {
        "stamps": {},
        "url": f"ws://127.0.0.1:{port}/",
        "origin": f"http://127.0.0.1:{port}",
        "mode": "given",
        "pages": rendered,
        "seconds": 30.0,
        "rate": 0,
        "in_flight": 200,
        "concurrency": 1,
        "keep": PAGES,
        "subscribe": "url",
    }
    given = await Run(spec).run()
    assert given["errors"] and not given["kept"]
    wrong, checked, passed = bench_page_views.check_given(given, rendered)
    assert (wrong, checked) == (0, 0)
    assert not passed


@pytest.mark.django_db
def test_the_snapshot_check_passes_only_with_every_page_checked_and_right(
    make_user: Callable[..., Any],
) -> None:
    users = [make_user() for _ in range(4)]
    ids = [user.pk for user in users[2:]]
    rendered = [
        {"viewer": viewer.pk, "users": ids, "shown": bench_page_views.shown(viewer, ids)}
        for viewer in users[:2]
    ]

    def answered(viewer: int) -> dict[str, Any]:
        # Nothing changed since the page was rendered: every user unchanged.
        return {"viewer": viewer, "presences": {}, "unchanged": [str(uid) for uid in ids]}

    both = {"kept": [answered(users[0].pk), answered(users[1].pk)], "errors": {}}
    assert bench_page_views.check_given(both, rendered) == (0, 2, True)
    # One page's view failed: the one checked is right, and the check does not pass.
    one = {"kept": [answered(users[0].pk)], "errors": {"RuntimeError": 1}}
    assert bench_page_views.check_given(one, rendered) == (0, 1, False)
    # A wrong answer: the user shown online though nothing says so.
    wrong = answered(users[1].pk)
    wrong["presences"] = {str(ids[0]): {"status": "online"}}
    wrong["unchanged"] = [str(ids[1])]
    some = {"kept": [answered(users[0].pk), wrong], "errors": {}}
    assert bench_page_views.check_given(some, rendered) == (1, 2, False)


def test_a_benchmark_run_stopped_by_sigterm_cleans_up(tmp_path: Path) -> None:
    # A "Redis" that takes the connection and never answers: the run waits on it, inside the
    # part whose finally removes its temporary database directory.
    silent = socket.create_server(("127.0.0.1", 0))
    silent.settimeout(1.0)
    port = silent.getsockname()[1]
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{port}/0", "TMPDIR": str(tmp_path)}
    run = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "--quick", "middleware"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    held = None
    deadline = time.monotonic() + 120
    try:
        while held is None and time.monotonic() < deadline:
            try:
                held, _ = silent.accept()
            except TimeoutError:
                assert run.poll() is None, "the run ended before it asked Redis anything"
        assert held is not None, "the run never asked Redis anything"
        assert list(tmp_path.glob("presence-bench-*")), "its database directory, made first"
        run.send_signal(signal.SIGTERM)
        code = run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if held is not None:
            held.close()
        silent.close()
    assert code == 128 + signal.SIGTERM  # SystemExit from the handler, not killed by the signal
    assert not list(tmp_path.glob("presence-bench-*"))  # the finally blocks ran


def test_the_benchmarks_ids_never_overlap() -> None:
    # One `make bench` runs every benchmark on one database, each leaving its users there: the
    # feed's invisible users once sat in the online count's ids (counted out of its count).
    spans = sorted(ID_RANGES.items(), key=lambda item: item[1].start)
    for (name, span), (next_name, next_span) in itertools.pairwise(spans):
        assert span.stop <= next_span.start, (name, next_name)
    assert spans[-1][1].stop <= AUTO_IDS_FROM
    full = Sizes.for_mode(quick=False)
    feed = bench_feed.FeedSizes.for_mode(quick=False)
    # (first id, the id past its last at full size, range): each benchmark's ids are in its range.
    used = [
        (bench_online_friends.VIEWER_ID, full.population + 3, "site"),
        (bench_middleware.USER_ID, bench_middleware.USER_ID + 1, "middleware"),
        (
            bench_user_connections.MEMORY_FIRST_ID,
            bench_user_connections.MEMORY_FIRST_ID + 61_000,
            "user_connections",
        ),
        (bench_rooms.BASE_ID, bench_rooms.BASE_ID + 10_000, "rooms"),
        (bench_room_rules.BASE_ID, bench_room_rules.BASE_ID + 1_000, "room_rules"),
        (
            bench_rooms_peers.BASE_ID,
            bench_rooms_peers.BASE_ID + 100_001 + bench_rooms_peers.SAMPLES,
            "rooms_peers",
        ),
        (
            bench_join_flood.BASE_ID,
            bench_join_flood.BASE_ID + bench_join_flood.MEMBERS + 10,
            "join_flood",
        ),
        (bench_cleanup.FIRST_ID, bench_cleanup.FIRST_ID + full.stale, "cleanup"),
        (
            bench_cleanup.ONLINE_FIRST_ID,
            bench_cleanup.ONLINE_FIRST_ID + bench_cleanup.ONLINE_COUNT,
            "cleanup_online",
        ),
        (bench_fanout.BASE_ID, bench_fanout.BASE_ID + 1_001, "fanout"),
        (
            ID_RANGES["fanout_exceptions"].start,
            ID_RANGES["fanout_exceptions"].start + 1_002,
            "fanout_exceptions",
        ),
        (bench_heartbeats.BASE_ID, bench_heartbeats.BASE_ID + 2_000, "heartbeats"),
        (bench_heartbeats.WRITERS_BASE_ID, bench_heartbeats.WRITERS_BASE_ID + 2_000, "heartbeats"),
        (
            bench_connections.BASE_ID,
            bench_connections.BASE_ID + 5_000 + bench_connections.WARM + 1,
            "connections",
        ),
        (bench_metrics.HEARTBEAT_BASE_ID, bench_metrics.HEARTBEAT_BASE_ID + 1_000, "metrics"),
        (bench_metrics.FANOUT_BASE_ID, bench_metrics.FANOUT_BASE_ID + 1_001, "metrics"),
        (bench_feed.FIRST_ID, bench_feed.FIRST_ID + feed.users, "feed"),
        (
            bench_online_count.FIRST_ID,
            bench_online_count.FIRST_ID + full.population + 1,  # and one by the real script
            "online_count",
        ),
        (
            bench_guest_count.FIRST_MEMBER,
            bench_guest_count.FIRST_MEMBER + bench_guest_count.REQUESTS,
            "guest_count",
        ),
        (
            bench_cleanup.PROBE_FIRST_ID,
            # a bucket's stale entries (about 61 of 1,000,000 in 16,384 buckets), a bucket apart
            bench_cleanup.PROBE_FIRST_ID + 500 * 16_384,
            "cleanup_probe",
        ),
    ]
    wrong = [
        (first, stop, name)
        for first, stop, name in used
        if not (first in ID_RANGES[name] and stop <= ID_RANGES[name].stop)
    ]
    assert wrong == []
