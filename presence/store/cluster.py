"""Running plans on a Redis Cluster (``PRESENCE["REDIS_CLUSTER"]``) through redis-py's
``RedisCluster`` (sync) and ``redis.asyncio.cluster.RedisCluster`` (async).

Every command of a plan touches keys of one slot (:mod:`presence.store.keys`), so a plan is
split by master: each master gets one pipeline of its commands, and the pipelines are written to
all masters before any reply is read (sync) or gathered (async). A batch read therefore costs one
round trip per master, in parallel. redis-py's ``ClusterPipeline`` refuses ``EVALSHA``; these
pipelines are sent on each master's own connection, where scripts run as anywhere else.

What the cluster answers on the way is handled here, command by command:

- ``MOVED`` (a slot migrated): the slot table is updated and the command re-sent to its master;
- ``ASK`` (a slot migrating): the command is re-sent to the target node after ``ASKING``;
- ``TRYAGAIN`` (a script's keys half-migrated): re-sent shortly after, a few times;
- ``NOSCRIPT`` (a master restarted or flushed its scripts): the script is loaded there and the
  command re-sent; none of these ran the first time, so nothing runs twice;
- a master that cannot be reached (or a slot no master serves): its commands' replies are
  :class:`NodeUnavailable`; the outage is logged once per node, the node is left alone for
  ``RETRY_INTERVAL``, and the slot table is read again before it is tried again (a replica may
  have taken over). The store reads what the other masters answered (``Plan.partial``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio.cluster
import redis.cluster
from redis._parsers.commands import AsyncCommandsParser
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from presence.store.health import Health
from presence.store.redact import redact_url

#: rounds of MOVED / ASK / TRYAGAIN / NOSCRIPT answers followed for one plan
MAX_REDIRECTS = 5
#: pause before re-sending a command refused with TRYAGAIN (a slot half-migrated)
TRYAGAIN_DELAY = 0.02


class NodeUnavailable(RedisError):
    """The reply of a command whose master could not be reached (or whose slot no master
    serves): that master's users are unknown, the others' replies stand."""


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


class _ReachableCommandsParser(AsyncCommandsParser):
    """The async client's command table, read from the first primary that answers."""

    def __init__(self, cluster: redis.asyncio.cluster.RedisCluster) -> None:
        super().__init__()
        self.cluster = cluster

    async def initialize(self, node: Any = None) -> None:
        error: Exception | None = None
        primaries = self.cluster.nodes_manager.get_nodes_by_server_type("primary")
        for candidate in [node, *primaries]:
            if candidate is None:
                continue
            try:
                await super().initialize(candidate)
                return
            except (RedisConnectionError, RedisTimeoutError, OSError) as failed:
                error = failed
        raise error or RedisClusterException("no primary answered COMMAND")


class ClusterRunner:
    """Sends plans' commands to the masters of a Redis Cluster, one pipeline per master."""

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
        #: answers followed: "moved", "ask", "tryagain", "noscript" (tests and monitoring)
        self.redirects: Counter[str] = Counter()
        self._sync: redis.cluster.RedisCluster | None = None
        self._async: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, redis.asyncio.cluster.RedisCluster
        ] = weakref.WeakKeyDictionary()
        self._stale_topology = False

    # --- clients ----------------------------------------------------------------------------

    @property
    def client(self) -> redis.cluster.RedisCluster:
        if self._sync is None:
            self._sync = _RedisCluster(
                startup_nodes=[redis.cluster.ClusterNode(host, port) for host, port in self.nodes],
                retry=Retry(NoBackoff(), 0),
                require_full_coverage=False,
                **self.kwargs,
            )
        return self._sync

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
            client.commands_parser = _ReachableCommandsParser(client)
            self._async[loop] = client
        return client

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def aclose(self) -> None:
        client = self._async.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    # --- per-node health --------------------------------------------------------------------

    def health_of(self, name: str) -> Health:
        health = self.node_health.get(name)
        if health is None:
            health = self.node_health[name] = Health(f"Redis Cluster node {name}")
        return health

    def _node_failed(self, name: str, error: Exception) -> NodeUnavailable:
        self.health_of(name).failed(error, self.retry_interval)
        self._stale_topology = True
        return NodeUnavailable(f"{name}: {redact_url(str(error))}")

    def _node_succeeded(self, name: str) -> None:
        health = self.node_health.get(name)
        if health is not None:
            health.succeeded()

    # --- routing ----------------------------------------------------------------------------

    def _route(
        self,
        nodes_manager: Any,
        commands: Sequence[tuple[Any, ...]],
        positions: Sequence[int],
        asking: dict[int, tuple[str, int]],
        replies: list[Any],
    ) -> dict[str, tuple[Any, list[int]]]:
        """{node name: (node, positions)}; positions of no reachable master get their reply."""
        groups: dict[str, tuple[Any, list[int]]] = {}
        for position in positions:
            if position in asking:
                host, port = asking[position]
                node = nodes_manager.get_node(host=host, port=port)
                if node is None:
                    replies[position] = NodeUnavailable(f"{host}:{port} is not a known node")
                    continue
            else:
                try:
                    node = nodes_manager.get_node_from_slot(
                        key_slot(first_key(commands[position]).encode())
                    )
                except SlotNotCoveredError as error:
                    replies[position] = NodeUnavailable(str(error))
                    continue
            if not self.health_of(node.name).available():
                replies[position] = NodeUnavailable(f"{node.name} is in an outage")
                continue
            groups.setdefault(node.name, (node, []))[1].append(position)
        return groups

    def _settle(
        self,
        commands: Sequence[tuple[Any, ...]],
        positions: Sequence[int],
        node_name: str,
        replies: list[Any],
        asking: dict[int, tuple[str, int]],
        scripts_to_load: dict[str, set[Any]],
    ) -> tuple[list[int], list[MovedError]]:
        """Replies that ask for another try: the positions to send again and the MOVED
        answers (to update the slot table with)."""
        again: list[int] = []
        moved: list[MovedError] = []
        for position in positions:
            reply = replies[position]
            asking.pop(position, None)
            if isinstance(reply, MovedError):
                self.redirects["moved"] += 1
                moved.append(reply)
                again.append(position)
            elif isinstance(reply, AskError):
                self.redirects["ask"] += 1
                asking[position] = (reply.host, reply.port)
                again.append(position)
            elif isinstance(reply, TryAgainError):
                self.redirects["tryagain"] += 1
                again.append(position)
            elif isinstance(reply, NoScriptError):
                self.redirects["noscript"] += 1
                scripts_to_load[node_name].add(commands[position][1])
                again.append(position)
            elif isinstance(reply, ClusterDownError):
                replies[position] = NodeUnavailable(f"{node_name}: {reply}")
        return again, moved

    # --- sync -------------------------------------------------------------------------------

    def execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Each command's reply, or the exception it raised (NodeUnavailable for an
        unreachable master), in order."""
        client = self.client
        manager = client.nodes_manager
        if self._stale_topology:
            self._stale_topology = False
            try:
                manager.initialize()
            except (RedisError, RedisClusterException, OSError):
                self._stale_topology = True
        replies: list[Any] = [None] * len(commands)
        pending = list(range(len(commands)))
        asking: dict[int, tuple[str, int]] = {}
        for attempt in range(MAX_REDIRECTS):
            groups = self._route(manager, commands, pending, asking, replies)
            scripts_to_load: dict[str, set[Any]] = defaultdict(set)
            sent = []
            for name, (node, positions) in groups.items():
                sent.append(
                    (name, node, positions, self._send(client, node, commands, positions, asking))
                )
            pending = []
            any_tryagain = False
            for name, node, positions, connection in sent:
                self._read(client, node, name, connection, commands, positions, asking, replies)
                again, moved = self._settle(
                    commands, positions, name, replies, asking, scripts_to_load
                )
                for error in moved:
                    manager.move_slot(error)
                any_tryagain |= any(isinstance(replies[p], TryAgainError) for p in again)
                pending += again
            for name, scripts in scripts_to_load.items():
                loader = manager.get_node(node_name=name)
                if loader is None:
                    continue  # the node left the cluster: the next round routes elsewhere
                node_client = client.get_redis_connection(loader)
                for script in scripts:
                    node_client.script_load(script.source)
            if not pending:
                break
            if any_tryagain and attempt < MAX_REDIRECTS - 1:
                time.sleep(TRYAGAIN_DELAY)
        return replies

    def _send(
        self,
        client: redis.cluster.RedisCluster,
        node: Any,
        commands: Sequence[tuple[Any, ...]],
        positions: Sequence[int],
        asking: dict[int, tuple[str, int]],
    ) -> Any:
        """Writes the node's pipeline; returns its connection, or the error that stopped it."""
        pool = client.get_redis_connection(node).connection_pool
        connection = None
        try:
            connection = pool.get_connection()
            wire: list[tuple[Any, ...]] = []
            for position in positions:
                if position in asking:
                    wire.append(("ASKING",))
                wire.append(wire_args(commands[position]))
            connection.send_packed_command(connection.pack_commands(wire))
            self.round_trips[node.name] += 1
            return connection
        except (RedisError, OSError) as error:
            if connection is not None:
                connection.disconnect()
                pool.release(connection)
            return error

    def _read(
        self,
        client: redis.cluster.RedisCluster,
        node: Any,
        name: str,
        connection: Any,
        commands: Sequence[tuple[Any, ...]],
        positions: Sequence[int],
        asking: dict[int, tuple[str, int]],
        replies: list[Any],
    ) -> None:
        if isinstance(connection, Exception):
            unavailable = self._node_failed(name, connection)
            for position in positions:
                replies[position] = unavailable
            return
        node_client = client.get_redis_connection(node)
        read = 0
        try:
            for position in positions:
                if position in asking:
                    with contextlib.suppress(ResponseError):
                        node_client.parse_response(connection, "ASKING")
                try:
                    replies[position] = node_client.parse_response(
                        connection, str(wire_args(commands[position])[0])
                    )
                except ResponseError as error:
                    replies[position] = error
                read += 1
        except (RedisError, OSError) as error:
            connection.disconnect()
            unavailable = self._node_failed(name, error)
            # The replies not read (a retried command may still hold last round's MOVED).
            for position in positions[read:]:
                replies[position] = unavailable
        else:
            self._node_succeeded(name)
        finally:
            node_client.connection_pool.release(connection)

    # --- async ------------------------------------------------------------------------------

    async def aexecute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        client = self.async_client()
        await client.initialize()  # once; later calls return at once
        manager = client.nodes_manager
        if self._stale_topology:
            self._stale_topology = False
            try:
                await manager.initialize()
            except (RedisError, RedisClusterException, OSError):
                self._stale_topology = True
        replies: list[Any] = [None] * len(commands)
        pending = list(range(len(commands)))
        asking: dict[int, tuple[str, int]] = {}
        for attempt in range(MAX_REDIRECTS):
            groups = self._route(manager, commands, pending, asking, replies)
            scripts_to_load: dict[str, set[Any]] = defaultdict(set)
            await asyncio.gather(
                *(
                    self._apipeline(node, name, commands, positions, asking, replies)
                    for name, (node, positions) in groups.items()
                )
            )
            pending = []
            any_tryagain = False
            for name, (_, positions) in groups.items():
                again, moved = self._settle(
                    commands, positions, name, replies, asking, scripts_to_load
                )
                for error in moved:
                    await manager.move_slot(error)
                any_tryagain |= any(isinstance(replies[p], TryAgainError) for p in again)
                pending += again
            for name, scripts in scripts_to_load.items():
                node = manager.get_node(node_name=name)
                if node is None:
                    continue  # the node left the cluster: the next round routes elsewhere
                for script in scripts:
                    await node.execute_command("SCRIPT", "LOAD", script.source)
            if not pending:
                break
            if any_tryagain and attempt < MAX_REDIRECTS - 1:
                await asyncio.sleep(TRYAGAIN_DELAY)
        return replies

    async def _apipeline(
        self,
        node: Any,
        name: str,
        commands: Sequence[tuple[Any, ...]],
        positions: Sequence[int],
        asking: dict[int, tuple[str, int]],
        replies: list[Any],
    ) -> None:
        from redis.asyncio.cluster import PipelineCommand

        wire: list[PipelineCommand] = []
        owners: list[int | None] = []
        for position in positions:
            if position in asking:
                wire.append(PipelineCommand(len(wire), "ASKING"))
                owners.append(None)
            wire.append(PipelineCommand(len(wire), *wire_args(commands[position])))
            owners.append(position)
        try:
            self.round_trips[name] += 1
            try:
                await node.execute_pipeline(wire)
                lost = bool(wire) and isinstance(wire[0].result, RedisConnectionError)
            except RedisConnectionError:
                lost = True
            if lost:
                # No reply at all: a restarted master closed the pooled connection before it
                # read anything. Once more, on a new connection.
                for command in wire:
                    command.result = None
                self.round_trips[name] += 1
                await node.execute_pipeline(wire)
        except (RedisError, OSError) as error:
            unavailable = self._node_failed(name, error)
            for position in positions:
                replies[position] = unavailable
            return
        failed: Exception | None = None
        for command, owner in zip(wire, owners, strict=True):
            result = command.result
            if isinstance(result, ResponseError) or not isinstance(result, Exception):
                if owner is not None:
                    replies[owner] = result
            else:
                failed = result
                if owner is not None:
                    replies[owner] = result
        if failed is not None:
            unavailable = self._node_failed(name, failed)
            for position in positions:
                if isinstance(replies[position], Exception) and not isinstance(
                    replies[position], ResponseError
                ):
                    replies[position] = unavailable
        else:
            self._node_succeeded(name)
