from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth import get_user_model

from presence import admission, copies, signals
from presence import store as store_module
from presence.conf import get_settings
from presence.middleware import throttle
from presence.rooms.shared import KNOWN


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("REDIS_URL"):
        raise pytest.UsageError(
            "REDIS_URL is not set. Run `make test` (it starts a throwaway redis-server), or "
            "`python -m tools.redis_server -- pytest`, or set REDIS_URL to a Redis whose "
            "database the tests may flush."
        )


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ["REDIS_URL"]


def cluster_urls() -> list[str]:
    """The Redis Cluster of the cluster run (tests/settings/base.py), or [] on one Redis."""
    from django.conf import settings

    return list(getattr(settings, "TEST_REDIS_CLUSTER", []))


on_one_redis = pytest.mark.skipif(
    bool(os.environ.get("REDIS_CLUSTER_URLS")),
    reason="reads one Redis server's internals; the cluster has tests of its own",
)

on_the_core_layer = pytest.mark.skipif(
    os.environ.get("PRESENCE_TEST_LAYER") == "pubsub",
    reason="reads the core channel layer's group keys; the pub/sub layer keeps none",
)


async def close_pubsub_layer() -> None:
    """The pub/sub layer keeps a receiver task per event loop for as long as the loop lives
    (a production process's whole life); a test's loop ends with the test, so it is closed
    here, not left to outlive the test (the core layer keeps no task of its own)."""
    from channels.layers import get_channel_layer
    from channels_redis.pubsub import RedisPubSubChannelLayer

    layer = get_channel_layer()
    if isinstance(layer, RedisPubSubChannelLayer):
        await layer.flush()


def cluster_client(urls: list[str], **kwargs: Any) -> Any:
    """redis-py's RedisCluster over these startup node URLs (read as the store reads them)."""
    from redis.cluster import ClusterNode, RedisCluster

    from presence.store.cluster import startup_nodes

    nodes, options = startup_nodes(urls)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes], **options, **kwargs
    )


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[Any]:
    """A client of presence's Redis: the cluster in the cluster run (same commands)."""
    urls = cluster_urls()
    client: Any
    if urls:
        client = cluster_client(urls, decode_responses=True)
    else:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def _flush_presence_state(redis_url: str) -> None:
    urls = cluster_urls()
    if urls:
        from redis.cluster import RedisCluster

        cluster = cluster_client(urls)
        try:
            cluster.flushall(target_nodes=RedisCluster.PRIMARIES)
        finally:
            cluster.close()
    # One Redis: presence, the cache and the channel layer; the cluster run: the layer's two.
    for url in filter(None, [redis_url, urls and os.environ.get("REDIS_SHARD_URL")]):
        client = redis.Redis.from_url(url)
        client.flushdb()
        client.close()


UNREACHABLE = "redis://127.0.0.1:1"
#: the cluster run's SOCKET_TIMEOUT where a test sets none (as tests/live/sockets.py's BASE)
PATIENT_SOCKET_TIMEOUT = 5


def cache_is_down() -> bool:
    from django.conf import settings

    location = str(settings.CACHES.get("default", {}).get("LOCATION", ""))
    return location.startswith(UNREACHABLE + "/")


@pytest.fixture(autouse=True)
def _no_receive_left_on_a_closed_loop() -> None:
    """The channel layer object outlives each test's event loop (a server process has one
    loop for its life). A receive that a test's loop ended in the middle of, or cancelled
    while it waited for a lock (channels_redis counts receivers and keeps asyncio locks, bound
    to the loop that first waited on them), would make later receives fail with "bound to a
    different event loop". No receive runs between two tests: that state starts afresh."""
    from channels.layers import channel_layers
    from channels_redis.core import ChannelLock, RedisChannelLayer

    for layer in list(channel_layers.backends.values()):
        # Only the core layer (the pub/sub layer looks attributes up in a layer per loop).
        if not isinstance(layer, RedisChannelLayer):
            continue
        if layer.receive_count:
            layer.receive_count = 0
            layer.receive_lock = None
            layer.receive_event_loop = None
        # Per-channel locks (keyed by the process's channel name, the same in every test): a
        # receive cancelled while waiting for one leaves it behind, bound to its loop.
        layer.receive_clean_locks = ChannelLock()


@pytest.fixture(autouse=True)
def _clean_presence_state(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[None]:
    """Each test starts with an empty Redis database, fresh settings and no throttle memory.

    In the cluster run, every PRESENCE a test sets keeps pointing at the cluster.
    """
    urls = cluster_urls()
    if urls:
        from presence import conf

        site_settings = conf.user_settings

        def on_the_cluster() -> Any:
            raw = site_settings()
            if not isinstance(raw, dict):
                return raw
            cluster = raw.get("REDIS_CLUSTER", urls)
            if list(cluster) == urls and cache_is_down():
                # An outage test points the cache at a port nobody listens on: so the cluster.
                cluster = [UNREACHABLE]
            if list(raw.get("REDIS_CLUSTER", urls)) != urls:
                return {**raw, "REDIS_CLUSTER": cluster}  # a cluster of the test's own
            # A page's call waits SOCKET_TIMEOUT (0.5 s) for Redis and then answers without it,
            # and the cluster's face takes a late reply for a node outage (RETRY_INTERVAL of
            # answers without Redis): on a machine saturated by other work, a reply of this
            # run's cluster can be that late, and a privacy case read offline. Tests that
            # mean a short timeout set their own.
            return {"SOCKET_TIMEOUT": PATIENT_SOCKET_TIMEOUT, **raw, "REDIS_CLUSTER": cluster}

        monkeypatch.setattr(conf, "user_settings", on_the_cluster)
        # ... and so the settings presence read depend on CACHES too.
        from django.core.signals import setting_changed

        def reread(*, setting: str, **kwargs: object) -> None:
            if setting == "CACHES":
                get_settings.cache_clear()
                store_module.reset_clients()

        setting_changed.connect(reread, dispatch_uid="tests.cluster.reread")
        request.addfinalizer(
            lambda: setting_changed.disconnect(dispatch_uid="tests.cluster.reread")
        )
    _flush_presence_state(redis_url)
    get_settings.cache_clear()
    store_module.reset_clients()
    _seed_presence_state()
    throttle.clear()
    KNOWN.clear()  # what an earlier test's reads of rooms resolved (presence.rooms.shared)
    copies.forget()  # an earlier test's users' choices, waiting for its Redis
    yield
    store_module.reset_clients()
    throttle.clear()
    copies.forget()


def _seed_presence_state() -> None:
    """A site's Redis holds its copy of the users' choices (presence.copies), seeded from the
    database once: the flushed one is seeded as from the test's empty database. The tests of
    a Redis that lost it flush or restart it themselves."""
    store = store_module.get_store()
    with contextlib.suppress(store_module.StoreUnavailable):
        store.run(store.plans.seed(store.keys.shards(), {}, {}))


_usernames = itertools.count()


@pytest.fixture
def make_user(db: Any) -> Callable[..., Any]:
    def make(username: str | None = None, **fields: Any) -> Any:
        name = username or f"user{next(_usernames)}"
        return get_user_model().objects.create_user(username=name, password="pw", **fields)

    return make


# --- Fixtures for the middleware, signals and presence_cleanup tests --------------------------
# (imports are local so this section can be appended without touching the header above)


#: the counter's own commands, the cluster client's discovery, and the closes listener's
#: subscription (once per process and store, on its own connection: presence.closes)
# A connection's handshake (HELLO, CLIENT SETINFO) is left out: another thread of the process
# (the closes listener reconnecting, a pool growing while two threads use it) may open one in the
# middle of a counted operation, and it is not one of that operation's round trips.
IGNORED_COMMANDS = frozenset(
    {
        "cmdstat_info",
        "cmdstat_cluster|nodes",
        "cmdstat_cluster|slots",
        "cmdstat_subscribe",
        "cmdstat_hello",
        "cmdstat_client",
        "cmdstat_client|setinfo",
        "cmdstat_client|setname",
    }
)


class RedisCommandCounter:
    """Counts the commands the real Redis server executed, from ``INFO commandstats`` deltas.

    Server-side counting needs no client instrumentation; the counter's own INFO calls are
    left out. One command in a delta also means one round trip.
    """

    def __init__(self, client: Any) -> None:
        #: every master of the cluster in the cluster run, else the one Redis
        self.clients = [client]
        urls = cluster_urls()
        if urls:
            self.clients = [
                redis.Redis(host=node.host, port=node.port) for node in client.get_primaries()
            ]

    def snapshot(self) -> dict[str, int]:
        # A transition's outbox claim runs on the receivers' thread, after the write that made
        # it: let earlier work finish so it is not counted as part of what comes next.
        signals.wait_sent()
        calls: dict[str, int] = {}
        for client in self.clients:
            for name, values in client.info("commandstats").items():
                if name not in IGNORED_COMMANDS:
                    key = name.removeprefix("cmdstat_")
                    calls[key] = calls.get(key, 0) + int(values["calls"])
        return calls

    def delta(self, before: dict[str, int]) -> dict[str, int]:
        after = self.snapshot()
        return {
            name: calls - before.get(name, 0)
            for name, calls in after.items()
            if calls != before.get(name, 0)
        }


@pytest.fixture
def redis_commands(redis_client: redis.Redis) -> RedisCommandCounter:
    return RedisCommandCounter(redis_client)


@pytest.fixture
def private_redis(settings: Any) -> Iterator[Any]:
    """A second, private redis-server that a test may stop and start again (outage tests).

    The default cache (and so presence) points at it; presence rebuilds its clients on
    ``setting_changed``.
    """
    from tools.redis_server import RedisServer

    if cluster_urls():
        pytest.skip(
            "an outage of one Redis; the cluster's fault tests are in tests/store/test_cluster.py"
        )
    with RedisServer() as server:
        caches = {alias: dict(conf) for alias, conf in settings.CACHES.items()}
        caches["default"]["LOCATION"] = server.url
        settings.CACHES = caches
        yield server


# --- Language hygiene for the template tag, JSON endpoint and admin tests ---------------------


@pytest.fixture(autouse=True)
def _reset_language() -> Iterator[None]:
    """A request with Accept-Language activates its language in the test's thread (Django's
    LocaleMiddleware does not undo it); start the next test in the default language again."""
    yield
    from django.utils import translation

    translation.deactivate()


@pytest.fixture(autouse=True)
def _python_collections() -> Iterator[None]:
    """A test that imports the demo's asgi.py installs its collection policy in this process
    (presence.collector): the next test runs with Python's own collections again, nothing
    frozen by it."""
    yield
    import gc

    from presence.collector import stop_collecting_in_short_pauses

    if stop_collecting_in_short_pauses():
        gc.unfreeze()


def _threads_let_go_of_the_database() -> None:
    """Close the connections Django opened in the sync_to_async worker thread and in presence's
    writes' thread (a thread's connections are its own: only it can close them)."""
    from asgiref.sync import SyncToAsync
    from django.db import connections

    from presence.consumers.writes import close_connections

    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=10)
    close_connections()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # The process's last test: before its session's fixtures drop the test database, the
    # threads let go of it (a test that used them without close_async_db_connections left a
    # connection open: PostgreSQL refused to drop a database "accessed by other users").
    if nextitem is None:
        _threads_let_go_of_the_database()


@pytest.fixture
async def close_async_db_connections() -> Any:
    """For async tests using the database: close the connections Django opened in the
    sync_to_async worker thread and in presence's writes' thread, so the test database can be
    flushed and dropped."""
    yield
    # From a thread of its own: the loop stays free for whatever those threads still await.
    await asyncio.to_thread(_threads_let_go_of_the_database)


@pytest.fixture
def clock() -> Iterator[Any]:
    """Time stands still at tests.clock.T0 until the test shifts it."""
    import time_machine

    from tests.clock import T0

    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


class GatherPauses:
    """presence.admission's pauses, held: each asked pause recorded in ``asked``, and waiting
    for ``resume`` instead of the clock."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.resume = asyncio.Event()

    async def pause(self, seconds: float) -> None:
        self.asked.append(seconds)
        await self.resume.wait()


@pytest.fixture
def gather_pauses(monkeypatch: pytest.MonkeyPatch) -> GatherPauses:
    """The joins' gathers (presence.admission.gather_while_waiting) paused until the test says."""
    pauses = GatherPauses()
    monkeypatch.setattr(admission, "_pause", pauses.pause)
    return pauses
