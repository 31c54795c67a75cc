"""Three real daphne processes sharing presence's Redis (one server, or a three-master Redis
Cluster) and a channel layer (one server, or sharded over two), driven by real WebSocket clients:
a change made through any process reaches viewers on every process; a process killed with
SIGKILL leaves its users offline to the others within CONNECTION_TTL; restarted on its port, it
serves again with no manual step, and changes flow both ways.

Every server a test starts is stopped by pid at the end, also when it fails.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from presence.models import Contact
from tests.daphne import Daphne, daphne_fixture  # noqa: F401 (the daphne fixture)
from tests.load.test_multiprocess import (
    GRACE,
    HEARTBEAT,
    MARGIN,
    TIMINGS,
    TTL,
    Socket,
    bare_session_of,
)
from tools.redis_cluster import RedisCluster
from tools.redis_server import RedisServer

pytest.importorskip("websockets.sync.client", reason="pip install -e '.[dev]' (websockets)")

PROCESSES = 3


@pytest.fixture(scope="module")
def cluster_backend() -> Iterator[dict[str, Any]]:
    """A three-master cluster for presence and a second Redis as a channel-layer shard."""
    with RedisCluster(masters=3) as cluster, RedisServer() as shard:
        yield {"presence": {"REDIS_CLUSTER": cluster.urls}, "layer": [shard.url]}


@pytest.fixture(params=["redis", "cluster"])
def backend(request: pytest.FixtureRequest, redis_url: str, settings: Any) -> dict[str, Any]:
    """What the processes (and this test process) share: PRESENCE additions, layer hosts."""
    if request.param == "redis":
        return {"presence": {}, "layer": None}
    shared = request.getfixturevalue("cluster_backend")
    settings.PRESENCE = {**TIMINGS, **shared["presence"]}
    return {"presence": shared["presence"], "layer": [redis_url, *shared["layer"]]}


@pytest.fixture
def people(make_user: Callable[..., Any]) -> tuple[list[Any], list[Any]]:
    """A user to come online through each process and a viewer on each, all friends."""
    users = [make_user(f"user{i}") for i in range(PROCESSES)]
    viewers = [make_user(f"viewer{i}") for i in range(PROCESSES)]
    everyone = users + viewers
    Contact.objects.bulk_create(
        [Contact(owner=a, contact=b) for a in everyone for b in everyone if a != b]
    )
    return users, viewers


def watch(server: Daphne, viewer: Any, users: list[Any]) -> Socket:
    socket = Socket(server, bare_session_of(viewer))
    socket.send({"type": "subscribe", "users": [u.pk for u in users]})
    socket.wait_for(lambda f: f["type"] == "presence_state")
    return socket


def test_three_processes_share_presence_survive_a_kill_and_a_restart(
    daphne: Callable[..., Daphne],
    backend: dict[str, Any],
    people: tuple[list[Any], list[Any]],
) -> None:
    users, viewers = people
    presence = {**TIMINGS, **backend["presence"]}
    servers = [daphne(presence, layer_hosts=backend["layer"]) for _ in range(PROCESSES)]
    sockets: list[Socket] = []
    try:
        watchers = [
            watch(server, viewer, users) for server, viewer in zip(servers, viewers, strict=True)
        ]
        sockets += watchers

        # Each user comes online through their own process; every viewer on every process sees it.
        own = []
        for server, user in zip(servers, users, strict=True):
            own.append(Socket(server, bare_session_of(user)))
            for watcher in watchers:
                watcher.presence_of(user, "online")
        sockets += own

        # SIGKILL the first process: its user turns offline to the viewers on the others.
        servers[0].kill()
        killed = time.monotonic()
        for watcher in watchers[1:]:
            watcher.presence_of(users[0], "offline", timeout=TTL + GRACE + MARGIN + 5)
        offline_after = time.monotonic() - killed
        # The full TTL after the last heartbeat (at most HEARTBEAT before the kill), not less.
        assert TTL - HEARTBEAT - 0.1 <= offline_after <= TTL + GRACE + MARGIN, offline_after

        # Restarted on its port, with no other step, it serves again.
        started = time.monotonic()
        restarted = daphne(presence, port=servers[0].port, layer_hosts=backend["layer"])
        serving_after = time.monotonic() - started
        back = Socket(restarted, bare_session_of(users[0]))
        sockets.append(back)
        for watcher in watchers[1:]:
            watcher.presence_of(users[0], "online")  # its changes reach the others
        watcher = watch(restarted, viewers[0], users)
        sockets.append(watcher)
        assert {pk: p["status"] for pk, p in watcher.frames[-1]["presences"].items()} == {
            str(u.pk): "online" for u in users
        }
        closed = time.monotonic()
        own[1].close()  # the others' changes reach it
        watcher.presence_of(users[1], "offline", timeout=GRACE + MARGIN + 2)
        # Never before the full grace after the close.
        assert time.monotonic() - closed >= GRACE
        print(
            f"offline {offline_after:.2f} s after SIGKILL; restart serving in {serving_after:.2f} s"
        )
    finally:
        for socket in sockets:
            with contextlib.suppress(Exception):
                socket.close()
