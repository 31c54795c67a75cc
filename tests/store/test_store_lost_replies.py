"""A command whose connection is lost after it was sent is never sent again: Redis may have run
it (its reply lost with the connection), and a write sent again would run twice (a rate limit
counting one request twice, a touch whose second run finds the user online already while the
first's transition goes unannounced). A pooled connection Redis closed before (a restart, a
proxy's idle timeout) is replaced when taken, before anything is sent on it, with no round trip
of its own.

Real faults: a TCP proxy (below) in front of a real Redis, or of each master of a real Redis
Cluster (tools/redis_cluster.py), drops a connection right after Redis answered a command.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings as django_settings
from django.test import override_settings

from presence.conf import PresenceSettings, get_settings
from presence.store import Plan, PresenceStore
from tests.conftest import on_one_redis
from tools.redis_cluster import RedisCluster

KEY = "lost-reply:counter"


class Proxy:
    """A TCP proxy in front of one Redis. It records what clients send, and, armed with a word,
    drops the connection of the next command holding it as soon as Redis answers (Redis ran
    it; its reply is lost with the connection). :meth:`close_connections` closes every client
    connection as a restarted Redis does."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.armed: bytes | None = None
        self.sent = bytearray()
        self.lock = threading.Lock()
        self.clients: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._serve, daemon=True)]
        self.threads[0].start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def arm(self, word: bytes) -> None:
        with self.lock:
            self.armed = word

    def take_sent(self) -> bytes:
        with self.lock:
            sent, self.sent = bytes(self.sent), bytearray()
        return sent

    def close_connections(self) -> None:
        with self.lock:
            clients, self.clients = self.clients, []
        for client in clients:
            _close(client)

    def close(self) -> None:
        _close(self.listener)  # (its shutdown wakes the accepting thread)
        self.close_connections()
        for thread in self.threads:
            thread.join(timeout=5)

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.upstream)
            dropping: dict[str, bool] = {"next reply": False}
            with self.lock:
                self.clients.append(client)
            for args in ((client, server, True), (server, client, False)):
                thread = threading.Thread(target=self._pipe, args=(*args, dropping), daemon=True)
                self.threads.append(thread)
                thread.start()

    def _pipe(
        self, source: socket.socket, sink: socket.socket, asked: bool, dropping: dict[str, bool]
    ) -> None:
        try:
            while data := source.recv(65536):
                if asked:
                    with self.lock:
                        self.sent += data
                        if self.armed is not None and self.armed in data:
                            self.armed = None
                            dropping["next reply"] = True
                elif dropping["next reply"]:
                    break  # Redis ran it and answered: the answer goes with the connection
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def command_names(sent: bytes) -> list[str]:
    """The name of each command in ``sent`` (RESP arrays of bulk strings)."""
    names: list[str] = []
    at = 0
    while at < len(sent):
        assert sent[at : at + 1] == b"*", sent[at:]
        end = sent.index(b"\r\n", at)
        count, at = int(sent[at + 1 : end]), end + 2
        for n in range(count):
            end = sent.index(b"\r\n", at)
            length, at = int(sent[at + 1 : end]), end + 2
            if n == 0:
                names.append(sent[at : at + length].decode().upper())
            at += length + 2
    return names


def counted(*more: tuple[Any, ...]) -> Plan[int | None]:
    """One INCR of the counter (and ``more`` commands after it: a pipeline); the count."""
    return Plan(
        commands=[("INCR", KEY), *more], parse=lambda replies: int(replies[0]), fallback=None
    )


def run_all(store: PresenceStore, face: str, *steps: Plan[Any] | Callable[[], None]) -> list[Any]:
    """Each plan of ``steps`` run in turn on one of the store's faces (a page's sync or async
    call, a live call), the other steps called between them; the plans' results."""
    results: list[Any] = []
    if face == "sync":
        for step in steps:
            if isinstance(step, Plan):
                results.append(store.run(step))
            else:
                step()
        return results

    async def on_the_event_loop() -> list[Any]:
        try:
            for step in steps:
                if isinstance(step, Plan):
                    results.append(await store.arun(step, live=face == "live"))
                else:
                    step()
        finally:
            await store.aclose()
        return results

    return asyncio.run(on_the_event_loop())


#: a read, on a connection then pooled
READ = Plan(commands=[("GET", KEY)], parse=lambda replies: replies[0], fallback="failed")
FACES = ["sync", "async", "live"]
#: one command (sent as itself), and a pipeline
PLANS = {"one command": counted(), "pipeline": counted(("GET", KEY))}


# --- one Redis --------------------------------------------------------------------------------


@pytest.fixture
def proxy(redis_url: str) -> Iterator[Proxy]:
    target = urlsplit(redis_url)
    running = Proxy(target.hostname or "127.0.0.1", target.port or 6379)
    yield running
    running.close()


@pytest.fixture
def store(proxy: Proxy, redis_url: str) -> Iterator[PresenceStore]:
    """A store whose Redis is reached through ``proxy``."""
    cache = dict(django_settings.CACHES["default"])
    cache["LOCATION"] = proxy.url + urlsplit(redis_url).path
    with override_settings(CACHES={**django_settings.CACHES, "default": cache}):
        built = PresenceStore(get_settings())
    yield built
    built.close()


@pytest.fixture(autouse=True)
def no_counter(redis_client: redis.Redis) -> Iterator[None]:
    redis_client.delete(KEY)
    yield
    redis_client.delete(KEY)


@on_one_redis
@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
def test_a_write_whose_reply_was_lost_runs_once(
    store: PresenceStore, proxy: Proxy, redis_client: redis.Redis, face: str, plan: Plan[Any]
) -> None:
    _, count = run_all(store, face, READ, lambda: proxy.arm(KEY.encode()), plan)
    assert count is None  # its caller never learnt it: the fallback
    assert redis_client.get(KEY) == "1"


@on_one_redis
@pytest.mark.parametrize("face", FACES)
def test_a_pooled_connection_redis_closed_is_replaced_before_anything_is_sent(
    store: PresenceStore, proxy: Proxy, redis_client: redis.Redis, face: str
) -> None:
    # (closed as a restarted Redis closes them)
    counts = run_all(store, face, counted(), proxy.close_connections, counted())
    assert counts == [1, 2]
    assert redis_client.get(KEY) == "2"
    assert store.health.available()


@on_one_redis
@pytest.mark.parametrize("face", FACES)
def test_a_command_costs_no_round_trip_of_its_own_to_check_its_connection(
    store: PresenceStore, proxy: Proxy, face: str
) -> None:
    # The check of a pooled connection polls its socket: no PING, nothing sent but the plans.
    run_all(store, face, READ, proxy.take_sent, READ, READ, READ)  # (past the handshake)
    assert command_names(proxy.take_sent()) == ["GET"] * 3


# --- a Redis Cluster --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(masters=3) as running:
        yield running


@pytest.fixture
def proxies(cluster: RedisCluster) -> Iterator[dict[int, Proxy]]:
    """A proxy in front of each master, by the master's port."""
    running = {port: Proxy("127.0.0.1", port) for port in cluster.master_ports()}
    for port in running:
        with redis.Redis(port=port) as master:
            master.flushall()
    yield running
    for each in running.values():
        each.close()


@pytest.fixture
def cluster_store(proxies: dict[int, Proxy]) -> Iterator[PresenceStore]:
    """A store of the cluster, reached through ``proxies`` (the addresses of the slot table
    mapped to them)."""
    conf = PresenceSettings(
        REDIS_CLUSTER=tuple(each.url for each in proxies.values()), RETRY_INTERVAL=60
    )
    built = PresenceStore(conf)
    assert built.cluster is not None

    def through_proxy(address: tuple[str, int]) -> tuple[str, int]:
        host, port = address
        return ("127.0.0.1", proxies[port].port) if port in proxies else (host, port)

    built.cluster.kwargs["address_remap"] = through_proxy
    yield built
    built.close()


def count_on_the_cluster(cluster: RedisCluster) -> str | None:
    from tests.conftest import cluster_client

    client = cluster_client(cluster.urls, decode_responses=True)
    try:
        return client.get(KEY)
    finally:
        client.close()


@pytest.mark.parametrize("face", FACES)
def test_on_a_cluster_a_write_whose_reply_was_lost_runs_once(
    cluster: RedisCluster, cluster_store: PresenceStore, proxies: dict[int, Proxy], face: str
) -> None:
    def arm() -> None:
        for each in proxies.values():
            each.arm(KEY.encode())

    _, count = run_all(cluster_store, face, READ, arm, counted())
    assert count is None
    assert count_on_the_cluster(cluster) == "1"


@pytest.mark.parametrize("face", FACES)
def test_on_a_cluster_a_pooled_connection_a_master_closed_is_replaced_before_anything_is_sent(
    cluster: RedisCluster, cluster_store: PresenceStore, proxies: dict[int, Proxy], face: str
) -> None:
    def restarted() -> None:
        for each in proxies.values():
            each.close_connections()

    assert run_all(cluster_store, face, counted(), restarted, counted()) == [1, 2]
    assert count_on_the_cluster(cluster) == "2"
    assert cluster_store.cluster is not None
    assert all(health.available() for health in cluster_store.cluster.node_health.values())
