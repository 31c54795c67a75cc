"""Each master's pipeline on a Redis Cluster, sync and async: the commands of one round written
to every master before any reply is read (sync) or gathered (async), on each master's own
connection (redis-py's ``ClusterPipeline`` refuses ``EVALSHA``); a master that cannot be reached
answers :class:`NodeUnavailable` for each of its commands.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.cluster
from redis.exceptions import RedisError, ResponseError

from presence import metrics
from presence.store.health import closed_by_peer, is_slow_reply
from presence.store.nodes import ClusterNodes, NodeUnavailable, wire_args
from presence.store.rounds import Exchange


class MasterPipelines(ClusterNodes):
    """Sends each master its pipeline of one round and reads the replies."""

    def _exchange(self, client: redis.cluster.RedisCluster, io: Exchange) -> None:
        started = time.perf_counter()
        sent = [
            (name, node, positions, self._send(client, node, io.commands, positions, io.asking))
            for name, (node, positions) in io.groups.items()
        ]
        for name, node, positions, connection in sent:
            self._read(
                client, node, name, connection, io.commands, positions, io.asking, io.replies
            )
            metrics.redis_round_trip(name, time.perf_counter() - started)

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
            # A late reply would come on this connection after the next command: it goes.
            connection.disconnect()
            unread: NodeUnavailable = (
                self._node_late(name, error)
                if is_slow_reply(error)
                else self._node_failed(name, error)
            )
            # The replies not read (a retried command may still hold last round's MOVED).
            for position in positions[read:]:
                replies[position] = unread
        else:
            self._node_succeeded(name)
        finally:
            node_client.connection_pool.release(connection)

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
            # A pooled connection a restarted master closed is replaced before anything is
            # sent on it: once sent, a pipeline whose connection is lost is never sent again
            # (Redis may have run it: no write runs twice, presence.store.connecting.no_retry).
            await _drop_the_next_if_closed(node)
            self.round_trips[name] += 1
            started = time.perf_counter()
            await node.execute_pipeline(wire)
            metrics.redis_round_trip(name, time.perf_counter() - started)
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


async def _drop_the_next_if_closed(node: Any) -> None:
    """The connection ``node`` (a redis.asyncio ClusterNode) hands its next pipeline, its first
    free one, disconnected if Redis closed it meanwhile (it connects again before sending):
    the node's connections are no pool's, and nothing else checks them when taken."""
    free = node._free
    # (another pipeline may take it meanwhile: then the next one is checked)
    while free and free[0].is_connected and closed_by_peer(free[0]):
        await free[0].disconnect()
