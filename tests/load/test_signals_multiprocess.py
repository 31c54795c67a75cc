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
    read: Callable[[], list[dict[str, Any]]], user: Any, count: int, rooms: bool = False
) -> list[dict[str, Any]]:
    """``user``'s signals (its rooms' with ``rooms``) once there are ``count`` of them and no
    more came for SETTLE s."""
    deadline = time.monotonic() + WAIT
    while len(of(read(), user, rooms)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(SETTLE)
    return of(read(), user, rooms)


def of(entries: list[dict[str, Any]], user: Any, rooms: bool = False) -> list[dict[str, Any]]:
    """``user``'s user_online / user_offline, or (``rooms``) room_entered / room_left."""
    kinds = ("entered", "left") if rooms else ("online", "offline")
    return [entry for entry in entries if entry["user"] == str(user.pk) and entry["kind"] in kinds]


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


ROOM_SETTINGS = {**TIMINGS, "ROOMS": {"post": None}}


def join_everywhere(sockets: list[Socket], room: str) -> None:
    """Each socket joins ``room`` at once (from as many threads): the processes race."""
    start = threading.Barrier(len(sockets))

    def one(socket: Socket) -> None:
        start.wait()
        socket.send({"type": "join", "room": room})

    threads = [threading.Thread(target=one, args=(socket,)) for socket in sockets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for socket in sockets:
        socket.wait_for(lambda f: f.get("type") == "room_state" and f.get("room") == room)


def test_one_room_signal_per_transition_across_processes_and_a_kill(
    daphne: Callable[..., Daphne],
    make_user: Callable[..., Any],
    signal_list: Callable[[], list[dict[str, Any]]],
) -> None:
    """room_entered / room_left: the user's connections on three processes join one room at
    once: entered once; all close: left once, after the grace. Then the process holding their
    only connection in the room is killed: left once, by a survivor's sweep (after the TTL)."""
    first, second, third = (daphne(ROOM_SETTINGS) for _ in range(PROCESSES))
    ben = make_user("ben")
    cookie = bare_session_of(ben)
    sockets = open_everywhere([first, second, third], cookie)
    join_everywhere(sockets, "post:1")
    assert [e["kind"] for e in wait_for_signals(signal_list, ben, 1, rooms=True)] == ["entered"]
    for socket in sockets:
        socket.close()
    entries = wait_for_signals(signal_list, ben, 2, rooms=True)
    assert [(e["kind"], e["room"]) for e in entries] == [("entered", "post:1"), ("left", "post:1")]

    watcher = Socket(third, bare_session_of(make_user("ann")))  # a live process that sweeps
    doomed = Socket(first, cookie)
    join_everywhere([doomed], "post:2")
    assert len(wait_for_signals(signal_list, ben, 3, rooms=True)) == 3
    first.kill()
    entries = wait_for_signals(signal_list, ben, 4, rooms=True)
    assert [(e["kind"], e["room"]) for e in entries[2:]] == [
        ("entered", "post:2"),
        ("left", "post:2"),
    ]
    watcher.close()
