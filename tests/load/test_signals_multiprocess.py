"""user_online / user_offline across real daphne processes: one user connected to all of them
at once (connections opened in parallel, so the processes race to record them) makes exactly
one user_online and, once every connection closed, exactly one user_offline on the whole site;
a process killed with SIGKILL neither loses nor doubles one.

Each process's receivers (tests/sites/signal_probe, installed by tests.settings.daphne) push
what they got onto a Redis list; the test reads it.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.daphne import Daphne, daphne_fixture  # noqa: F401 (the daphne fixture)
from tests.load.test_multiprocess import GRACE, TIMINGS, TTL, Socket, bare_session_of
from tests.sites.signal_probe.apps import LIST_ENV

pytest.importorskip("websockets.sync.client", reason="pip install -e '.[dev]' (websockets)")

PROCESSES = 3
#: how long to keep watching for a second (doubled) signal once the expected ones arrived
SETTLE = 2.0
WAIT = 15.0


@pytest.fixture
def signal_list(
    monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis
) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The daphne processes started from now on record their signals; the reader of the list."""
    key = f"test:signals:{uuid.uuid4().hex}"
    monkeypatch.setenv(LIST_ENV, key)
    yield lambda: [json.loads(entry) for entry in redis_client.lrange(key, 0, -1)]
    redis_client.delete(key)


def wait_for_signals(
    read: Callable[[], list[dict[str, Any]]], user: Any, count: int
) -> list[dict[str, Any]]:
    """``user``'s signals once there are ``count`` of them and no more came for SETTLE s."""
    deadline = time.monotonic() + WAIT
    while len(of(read(), user)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(SETTLE)
    return of(read(), user)


def of(entries: list[dict[str, Any]], user: Any) -> list[dict[str, Any]]:
    return [entry for entry in entries if entry["user"] == str(user.pk)]


def open_everywhere(servers: list[Daphne], cookie: str) -> list[Socket]:
    """One socket of the user on each server, opened at once from as many threads."""
    sockets: list[Socket] = []
    start = threading.Barrier(len(servers))
    lock = threading.Lock()

    def one(server: Daphne) -> None:
        start.wait()
        socket = Socket(server, cookie)
        with lock:
            sockets.append(socket)

    threads = [threading.Thread(target=one, args=(server,)) for server in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(sockets) == len(servers)
    for socket in sockets:  # each connection recorded (frames come after the connect handler)
        socket.send({"type": "subscribe", "users": []})
        socket.wait_for(lambda f: f["type"] == "presence_state")
    return sockets


def test_one_signal_per_transition_whatever_the_processes_and_connections(
    daphne: Callable[..., Daphne],
    make_user: Callable[..., Any],
    signal_list: Callable[[], list[dict[str, Any]]],
) -> None:
    servers = [daphne(TIMINGS) for _ in range(PROCESSES)]
    pids = {server.process.pid for server in servers if server.process is not None}
    ben = make_user("ben")
    cookie = bare_session_of(ben)
    for rounds in (1, 2):  # online, offline, and again: one of each per transition
        sockets = [*open_everywhere(servers, cookie), Socket(servers[0], cookie)]
        time.sleep(TTL)  # heartbeats on every connection, from every process
        for socket in sockets:
            socket.close()
        entries = wait_for_signals(signal_list, ben, 2 * rounds)
        assert [entry["kind"] for entry in entries] == ["online", "offline"] * rounds
        assert {entry["pid"] for entry in entries} <= pids
        offline = entries[-1]
        # Sent once the grace ended, by whichever process's sweep noticed it first.
        assert offline["at"] <= time.time()
    assert not any(entry["invisible"] for entry in of(signal_list(), ben))


def test_a_killed_process_neither_loses_nor_doubles_a_signal(
    daphne: Callable[..., Daphne],
    make_user: Callable[..., Any],
    signal_list: Callable[[], list[dict[str, Any]]],
) -> None:
    first, second, third = (daphne(TIMINGS) for _ in range(PROCESSES))
    ann, ben = make_user("ann"), make_user("ben")
    watcher = Socket(third, bare_session_of(ann))  # a live process that sweeps
    ben_cookie = bare_session_of(ben)
    on_first, on_second = open_everywhere([first, second], ben_cookie)
    assert [e["kind"] for e in wait_for_signals(signal_list, ben, 1)] == ["online"]

    first.kill()  # ben is still online by the second process: no transition
    time.sleep(TTL + GRACE + 1)
    assert [e["kind"] for e in of(signal_list(), ben)] == ["online"]

    # Then ben's last process dies too: offline once, found by the third process's sweep.
    second_pid = second.process.pid if second.process is not None else None
    second.kill()
    entries = wait_for_signals(signal_list, ben, 2)
    assert [entry["kind"] for entry in entries] == ["online", "offline"]
    assert entries[1]["pid"] not in {second_pid}
    assert [e["kind"] for e in of(signal_list(), ann)] == ["online"]
    watcher.close()
    on_first.close()
    on_second.close()
