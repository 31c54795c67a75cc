"""Admission flood: one account's sockets must not queue ahead of everyone else's openings.

A process works on at most ``OPENINGS_AT_ONCE`` sockets' openings at once (presence.admission);
the others are accepted and wait their turn. One daphne process (``benchmarks.page_views_asgi``
on a free 127.0.0.1 port, default settings, stopped by its pid) serves a client process
(``benchmarks.admission_flood_client``: the ``websockets`` client over loopback) that measures
another user's first snapshot (handshake to ``presence_state`` for a page of users), side by
side in each round: idle, and with ``FLOOD`` sockets of one account opened just before it (ten
times ``MAX_CONNECTIONS_PER_USER``; each sends nothing). Goal: the flood adds at most 0.5 s.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.core.cache import cache

from benchmarks.common import Report, Sizes, flush, median, raw_client, say
from presence import api
from presence.models import Contact
from tools.processes import stop_process
from tools.redis_server import free_port

NAME = "admission_flood"
ROOT = Path(__file__).resolve().parent.parent
DAPHNE = Path(sys.executable).parent / "daphne"
APP = "benchmarks.page_views_asgi:application"
#: the flooder's sockets, all at once
FLOOD = 200
#: the other user's page: the users their first subscribe names
PAGE = 20
GOAL_ADDED = 0.5


def session_cookie(user: Any) -> str:
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return f"sessionid={session.session_key}"


def build_site() -> dict[str, Any]:
    """The flooder, the other user, and the other user's page (contacts, half of them online)."""
    User = get_user_model()
    flooder = User.objects.create_user("af-flooder", password="admission")
    other = User.objects.create_user("af-other", password="admission")
    page = [User.objects.create_user(f"af-page{n}").pk for n in range(PAGE)]
    Contact.objects.bulk_create(Contact(owner_id=other.pk, contact_id=pk) for pk in page)
    Contact.objects.bulk_create(Contact(owner_id=pk, contact_id=other.pk) for pk in page)
    for pk in page[::2]:
        api.touch(pk)
    return {"flooder": session_cookie(flooder), "other": session_cookie(other), "users": page}


def serves(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def start_server(log: Any) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "benchmarks.page_views_settings",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    process = subprocess.Popen(
        [str(DAPHNE), "-v", "0", "-b", "127.0.0.1", "-p", str(port), APP],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if serves(port):
            return process, port
        time.sleep(0.2)
    stop_process(process, timeout=10)
    log.seek(0)
    raise RuntimeError(f"daphne did not serve:\n{log.read().decode(errors='replace')[-4000:]}")


def run_client(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json") as spec_file:
        json.dump(spec, spec_file)
        spec_file.flush()
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.admission_flood_client", spec_file.name],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if done.returncode:
        raise RuntimeError(f"admission-flood client failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(sizes: Sizes, report: Report) -> None:
    quick = report.quick
    rounds = 2 if quick else 5
    say(
        f"\n== admission_flood: one server process; another user's first snapshot ({PAGE} "
        f"users), idle and with {FLOOD} sockets of one account opened just before; "
        f"{rounds} rounds =="
    )
    client = raw_client()
    flush(client)
    client.close()
    cache.clear()
    site = build_site()
    with tempfile.NamedTemporaryFile(prefix="admission-flood-daphne-", suffix=".log") as log:
        process, port = start_server(log)
        try:
            spec = {
                **site,
                "url": f"ws://127.0.0.1:{port}/ws/presence/",
                "origin": f"http://127.0.0.1:{port}",
                "flood": FLOOD,
                "rounds": 1,
            }
            run_client(spec, timeout=300)  # warm-up, not counted
            result = run_client({**spec, "rounds": rounds}, timeout=300 * rounds)
        finally:
            stop_process(process, timeout=15)
    idle, flooded = median(result["idle"]), median(result["flood"])
    added = flooded - idle
    say(
        "  first snapshot, idle:     "
        + ", ".join(f"{seconds * 1000:.0f}" for seconds in result["idle"])
        + " ms"
    )
    say(
        f"  first snapshot, {FLOOD} ahead: "
        + ", ".join(f"{seconds * 1000:.0f}" for seconds in result["flood"])
        + " ms"
    )
    say(
        f"  flood sockets opened {result['opened']}, closed by the server (by code) "
        f"{result['closed_by_server']}"
    )
    say(
        f"admission_flood: median {idle * 1000:.0f} ms idle, {flooded * 1000:.0f} ms with "
        f"{FLOOD} ahead: {added:+.2f} s, ratio {flooded / idle:.1f}"
    )
    report.add(
        NAME,
        f"other user's first snapshot, idle / {FLOOD} sockets of one account ahead",
        f"{idle * 1000:.0f} / {flooded * 1000:.0f} ms (x{flooded / idle:.1f})",
    )
    report.add(
        NAME,
        f"added by {FLOOD} sockets of one account ahead",
        f"{added:.2f} s",
        f"≤ {GOAL_ADDED} s",
        None if quick else added <= GOAL_ADDED,
    )
