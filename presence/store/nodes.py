"""The clients of a Redis Cluster (``PRESENCE["REDIS_CLUSTER"]``) and the health of each
master: redis-py's ``RedisCluster`` (sync) and ``redis.asyncio.cluster.RedisCluster`` (async),
made to start while a master is down. :mod:`presence.store.cluster` runs plans on them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import Counter
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio.cluster
import redis.cluster
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from presence.store.health import Health
from presence.store.redact import redact_url
from presence.store.sharing import publish_once

logger = logging.getLogger("presence")


class NodeUnavailable(RedisError):
    """The reply of a command whose master could not be reached (or whose slot no master
    serves): that master's users are unknown, the others' replies stand."""


class NodeLate(NodeUnavailable):
    """The reply of a command whose master answered later than the call waits (a page's
    SOCKET_TIMEOUT): unknown to this call, as from an unreachable master, but no outage. The
    master stays in use, as a late reply on one Redis is (presence.store.client)."""


def startup_nodes(urls: Sequence[str]) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """(host, port) of each startup node URL, and the connection options the URLs carry
    (credentials, TLS); the first URL with credentials gives them."""
    nodes: list[tuple[str, int]] = []
    options: dict[str, Any] = {}
    for url in urls:
        parts = urlsplit(url)
        nodes.append((parts.hostname or "127.0.0.1", parts.port or 6379))
        if parts.scheme == "rediss":
            options["ssl"] = True
        if parts.password and "password" not in options:
            options["password"] = unquote(parts.password)
            if parts.username:
                options["username"] = unquote(parts.username)
    return nodes, options


def first_key(command: tuple[Any, ...]) -> str:
    if command[0] == "SCRIPT":
        return str(command[2][0])
    return str(command[1])


def wire_args(command: tuple[Any, ...]) -> tuple[Any, ...]:
    if command[0] == "SCRIPT":
        _, script, keys, args = command
        return ("EVALSHA", script.sha, len(keys), *keys, *args)
    return command


class _RedisCluster(redis.cluster.RedisCluster):
    """redis-py's client, starting while a master is down: it reads the command table
    (``COMMAND``) from the first primary, which may be the one that is down."""

    def command(self, **kwargs: Any) -> Any:
        error: Exception | None = None
        for node in [self.nodes_manager.default_node, *self.get_primaries()]:
            try:
                return self.execute_command("COMMAND", target_nodes=node, **kwargs)
            except (RedisConnectionError, RedisTimeoutError, OSError) as failed:
                error = failed
        raise error or RedisClusterException("no primary answered COMMAND")


class _ReachableCommandsParser:
    """The async client's command table, read from the first primary that answers: wraps the
    client's own parser (its ``commands_parser``), whose other methods it passes through."""

    def __init__(self, cluster: redis.asyncio.cluster.RedisCluster) -> None:
        self.cluster = cluster
        self.parser = cluster.commands_parser

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parser, name)

    async def initialize(self, node: Any = None) -> None:
        error: Exception | None = None
        primaries = self.cluster.nodes_manager.get_nodes_by_server_type("primary")
        for candidate in [node, *primaries]:
            if candidate is None:
                continue
            try:
                await self.parser.initialize(candidate)
                return
            except (RedisConnectionError, RedisTimeoutError, OSError) as failed:
                error = failed
        raise error or RedisClusterException("no primary answered COMMAND")


class ClusterNodes:
    """The clients of a Redis Cluster and the health of each of its masters."""

    def __init__(
        self,
        urls: Sequence[str],
        kwargs: dict[str, Any],
        retry_interval: float,
        live_timeout: float | None = None,
    ) -> None:
        self.nodes, url_options = startup_nodes(urls)
        self.kwargs = {**kwargs, **url_options}
        self.retry_interval = retry_interval
        #: the async client's socket timeout (LIVE_SOCKET_TIMEOUT: see presence.store.client)
        self.live_timeout = live_timeout
        self.node_health: dict[str, Health] = {}
        #: round trips sent to each master (benchmarks and tests read it)
        self.round_trips: Counter[str] = Counter()
        #: answers followed: "moved", "ask", "tryagain", "noscript"; and "moving": a script
        #: stopped at a key whose slot is migrating, not sent again (tests and monitoring)
        self.redirects: Counter[str] = Counter()
        self._sync: redis.cluster.RedisCluster | None = None
        #: one sync client handed out at a time (see presence.store.sharing.publish_once)
        self._sync_lock = threading.Lock()
        self._async: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, redis.asyncio.cluster.RedisCluster
        ] = weakref.WeakKeyDictionary()
        self._stale_topology = False

    # --- clients ----------------------------------------------------------------------------

    @property
    def client(self) -> redis.cluster.RedisCluster:
        client = self._sync
        if client is None:
            made = _RedisCluster(
                startup_nodes=[redis.cluster.ClusterNode(host, port) for host, port in self.nodes],
                retry=Retry(NoBackoff(), 0),
                require_full_coverage=False,
                **self.kwargs,
            )
            client = publish_once(self, "_sync", made, self._sync_lock)
        return client

    def async_client(self) -> redis.asyncio.cluster.RedisCluster:
        """This event loop's client (it reads the slot table at its first command)."""
        loop = asyncio.get_running_loop()
        client = self._async.get(loop)
        if client is None:
            from redis.asyncio.retry import Retry as AsyncRetry

            kwargs = dict(self.kwargs)
            max_connections = kwargs.pop("max_connections", 1000)
            if self.live_timeout is not None:
                # Waits for a busy Redis and a busy event loop alike (see PresenceStore).
                for key in ("socket_timeout", "socket_connect_timeout"):
                    kwargs[key] = max(self.live_timeout, kwargs.get(key) or 0)
            client = redis.asyncio.cluster.RedisCluster(
                startup_nodes=[
                    redis.asyncio.cluster.ClusterNode(host, port) for host, port in self.nodes
                ],
                retry=AsyncRetry(NoBackoff(), 0),
                require_full_coverage=False,
                max_connections=max_connections,
                **kwargs,
            )
            client.commands_parser = _ReachableCommandsParser(client)  # type: ignore[assignment]
            self._async[loop] = client
        return client

    def close(self) -> None:
        with self._sync_lock:
            client, self._sync = self._sync, None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        client = self._async.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    # --- per-node health --------------------------------------------------------------------

    def health_of(self, name: str) -> Health:
        health = self.node_health.get(name)
        if health is None:
            health = self.node_health[name] = Health(f"Redis Cluster node {name}", node=name)
        return health

    def _node_failed(self, name: str, error: Exception) -> NodeUnavailable:
        self.health_of(name).failed(error, self.retry_interval)
        self._stale_topology = True
        return NodeUnavailable(f"{name}: {redact_url(str(error))}")

    def _node_late(self, name: str, error: Exception) -> NodeLate:
        reason = redact_url(str(error))
        logger.info("Presence: Redis Cluster node %s is slow: %s.", name, reason)
        return NodeLate(f"{name}: {reason}")

    def _node_succeeded(self, name: str) -> None:
        health = self.node_health.get(name)
        if health is not None:
            health.succeeded()
