"""The benchmarks' own checks (benchmarks/): the page-view benchmark's check of the snapshots
against ``bulk_presence``, and ``python -m benchmarks`` stopped by SIGTERM (``make bench``
under a timeout, or killed) still stopping and removing what it started."""

from __future__ import annotations

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

from benchmarks import bench_page_views
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
