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
from collections import defaultdict
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio.cluster
import redis.cluster
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

from presence.store.nodes import (
    ClusterNodes,
    NodeUnavailable,
    first_key,
    startup_nodes,
    wire_args,
)

__all__ = ["ClusterRunner", "NodeUnavailable", "first_key", "startup_nodes", "wire_args"]

#: rounds of MOVED / ASK / TRYAGAIN / NOSCRIPT answers followed for one plan
MAX_REDIRECTS = 5
#: pause before re-sending a command refused with TRYAGAIN (a slot half-migrated)
TRYAGAIN_DELAY = 0.02


@dataclass(frozen=True)
class _Refresh:
    """Read the slot table again (a master failed since the last plan)."""


@dataclass(frozen=True)
class _Exchange:
    """Send each master its pipeline of ``groups`` and read the replies into ``replies``."""

    groups: dict[str, tuple[Any, list[int]]]
    commands: Sequence[tuple[Any, ...]]
    asking: dict[int, tuple[str, int]]
    replies: list[Any]


@dataclass(frozen=True)
class _Moved:
    """Update the slot table with a MOVED answer."""

    error: MovedError


@dataclass(frozen=True)
class _LoadScripts:
    """Load these scripts on this master (it answered NOSCRIPT)."""

    node: Any
    scripts: set[Any]


@dataclass(frozen=True)
class _Pause:
    """Wait TRYAGAIN_DELAY before the next round (a slot half-migrated)."""


class ClusterRunner(ClusterNodes):
    """Sends plans' commands to the masters of a Redis Cluster, one pipeline per master."""

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

    # --- the rounds, written once -------------------------------------------------------------

    def _rounds(
        self, manager: Any, commands: Sequence[tuple[Any, ...]]
    ) -> Generator[Any, Any, list[Any]]:
        """Each command's reply, or the exception it raised (NodeUnavailable for an
        unreachable master), in order: the rounds of one plan, as a generator of the I/O they
        need (:class:`_Refresh`, :class:`_Exchange`, :class:`_Moved`, :class:`_LoadScripts`,
        :class:`_Pause`), which :meth:`execute` does in this thread and :meth:`aexecute` on the
        event loop."""
        if self._stale_topology:
            self._stale_topology = False
            try:
                yield _Refresh()
            except (RedisError, RedisClusterException, OSError):
                self._stale_topology = True
        replies: list[Any] = [None] * len(commands)
        pending = list(range(len(commands)))
        asking: dict[int, tuple[str, int]] = {}
        for attempt in range(MAX_REDIRECTS):
            groups = self._route(manager, commands, pending, asking, replies)
            scripts_to_load: dict[str, set[Any]] = defaultdict(set)
            yield _Exchange(groups, commands, asking, replies)
            pending = []
            any_tryagain = False
            for name, (_, positions) in groups.items():
                again, moved = self._settle(
                    commands, positions, name, replies, asking, scripts_to_load
                )
                for error in moved:
                    yield _Moved(error)
                any_tryagain |= any(isinstance(replies[p], TryAgainError) for p in again)
                pending += again
            for name, scripts in scripts_to_load.items():
                node = manager.get_node(node_name=name)
                if node is None:
                    continue  # the node left the cluster: the next round routes elsewhere
                yield _LoadScripts(node, scripts)
            if not pending:
                break
            if any_tryagain and attempt < MAX_REDIRECTS - 1:
                yield _Pause()
        return replies

    # --- sync -------------------------------------------------------------------------------

    def execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """:meth:`_rounds` in this thread: each master's pipeline written before any is read."""
        client = self.client
        manager = client.nodes_manager
        rounds = self._rounds(manager, commands)
        reply: Any = None
        error: Exception | None = None
        while True:
            try:
                io = rounds.send(reply) if error is None else rounds.throw(error)
            except StopIteration as done:
                return done.value
            reply, error = None, None
            try:
                if type(io) is _Exchange:
                    self._exchange(client, io)
                elif type(io) is _Moved:
                    manager.move_slot(io.error)
                elif type(io) is _LoadScripts:
                    node_client = client.get_redis_connection(io.node)
                    for script in io.scripts:
                        node_client.script_load(script.source)
                elif type(io) is _Refresh:
                    manager.initialize()
                else:
                    time.sleep(TRYAGAIN_DELAY)
            except Exception as failed:
                error = failed

    def _exchange(self, client: redis.cluster.RedisCluster, io: _Exchange) -> None:
        sent = [
            (name, node, positions, self._send(client, node, io.commands, positions, io.asking))
            for name, (node, positions) in io.groups.items()
        ]
        for name, node, positions, connection in sent:
            self._read(
                client, node, name, connection, io.commands, positions, io.asking, io.replies
            )

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
        """:meth:`_rounds` on this event loop: the masters' pipelines gathered."""
        client = self.async_client()
        await client.initialize()  # once; later calls return at once
        manager = client.nodes_manager
        rounds = self._rounds(manager, commands)
        reply: Any = None
        error: Exception | None = None
        while True:
            try:
                io = rounds.send(reply) if error is None else rounds.throw(error)
            except StopIteration as done:
                return done.value
            reply, error = None, None
            try:
                if type(io) is _Exchange:
                    await asyncio.gather(
                        *(
                            self._apipeline(
                                node, name, io.commands, positions, io.asking, io.replies
                            )
                            for name, (node, positions) in io.groups.items()
                        )
                    )
                elif type(io) is _Moved:
                    await manager.move_slot(io.error)
                elif type(io) is _LoadScripts:
                    for script in io.scripts:
                        await io.node.execute_command("SCRIPT", "LOAD", script.source)
                elif type(io) is _Refresh:
                    await manager.initialize()
                else:
                    await asyncio.sleep(TRYAGAIN_DELAY)
            except Exception as failed:
                error = failed

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
