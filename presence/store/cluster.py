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
  command re-sent, with the reads of its slot that ran after it (which missed its writes);
  none of those writes ran the first time, and a read run again changes nothing, so no write
  runs twice;
- a command that needs another's success first (``Plan.needs``: a room's write, its schedule
  first) is sent in a round after it, only once it succeeded;
- a master that cannot be reached (or a slot no master serves): its commands' replies are
  :class:`NodeUnavailable`; the outage is logged once per node, the node is left alone for
  ``RETRY_INTERVAL``, and the slot table is read again before it is tried again (a replica may
  have taken over). The store reads what the other masters answered (``Plan.partial``);
- a script Redis stopped at a key it built rather than declared, whose slot is migrating
  ("non local key"), is unknown to its plan alone, as a command still redirected after
  ``MAX_REDIRECTS`` rounds is: its slot is moving, its master is not in an outage. It is not
  sent again (Redis keeps what the script wrote before it stopped);
- any other error a master answers (out of memory, loading, read-only, busy) is that master's
  outage as well, never the cluster's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from redis.crc import key_slot
from redis.exceptions import RedisClusterException, RedisError, SlotNotCoveredError

from presence.steps import Steps
from presence.store.nodes import NodeUnavailable, first_key, startup_nodes, wire_args
from presence.store.pipelines import MasterPipelines
from presence.store.rounds import (
    MAX_REDIRECTS,
    TRYAGAIN_DELAY,
    ClusterRounds,
    Exchange,
    LoadScripts,
    Moved,
    Refresh,
)

__all__ = [
    "MAX_REDIRECTS",
    "TRYAGAIN_DELAY",
    "ClusterRunner",
    "NodeUnavailable",
    "first_key",
    "startup_nodes",
    "wire_args",
]


class ClusterRunner(ClusterRounds, MasterPipelines):
    """Sends plans' commands to the masters of a Redis Cluster, one pipeline per master: the
    rounds (:class:`ClusterRounds`) run in this thread or on the event loop."""

    # --- sync -------------------------------------------------------------------------------

    def execute(
        self, commands: Sequence[tuple[Any, ...]], needs: Mapping[int, int] | None = None
    ) -> list[Any]:
        """:meth:`_rounds` in this thread: each master's pipeline written before any is read."""
        client = self.client
        manager = client.nodes_manager
        steps = Steps(self._rounds(manager, commands, needs))
        for io in steps:
            try:
                if type(io) is Exchange:
                    self._exchange(client, io)
                elif type(io) is Moved:
                    manager.move_slot(io.error)
                elif type(io) is LoadScripts:
                    node_client = client.get_redis_connection(io.node)
                    for script in io.scripts:
                        node_client.script_load(script.source)
                elif type(io) is Refresh:
                    manager.initialize()
                else:
                    time.sleep(TRYAGAIN_DELAY)
            except Exception as failed:
                steps.failed = failed
        return steps.result

    # --- the keyspace, master by master ----------------------------------------------------

    def scan_masters(self, pattern: str, count: int) -> tuple[list[Any], list[str]]:
        """The keys matching ``pattern`` on every master (SCAN), and the masters that could not
        be read, whose keys are left out (each one's outage its own, as for a plan); raises
        when none could."""
        client = self.client
        keys: list[Any] = []
        unavailable: list[str] = []
        primaries = client.get_primaries()
        for node in primaries:
            if not self.health_of(node.name).available():
                unavailable.append(node.name)
                continue
            try:
                keys += client.get_redis_connection(node).scan_iter(match=pattern, count=count)
            except (RedisError, OSError) as error:
                self._node_failed(node.name, error)
                unavailable.append(node.name)
            else:
                self._node_succeeded(node.name)
        if len(unavailable) == len(primaries):
            raise RedisClusterException(f"no master answered ({', '.join(unavailable)})")
        return keys, unavailable

    def master_of(self, key: str) -> str:
        """The master holding ``key``'s slot, by the slot table as last read (to name it)."""
        slot = key_slot(key.encode())
        try:
            return str(self.client.nodes_manager.get_node_from_slot(slot).name)
        except SlotNotCoveredError:
            return f"slot {slot} (served by no master)"

    # --- async ------------------------------------------------------------------------------

    async def aexecute(
        self, commands: Sequence[tuple[Any, ...]], needs: Mapping[int, int] | None = None
    ) -> list[Any]:
        """:meth:`_rounds` on this event loop: the masters' pipelines gathered."""
        client = self.async_client()
        await client.initialize()  # once; later calls return at once
        manager = client.nodes_manager
        steps = Steps(self._rounds(manager, commands, needs))
        for io in steps:
            try:
                if type(io) is Exchange:
                    await asyncio.gather(
                        *(
                            self._apipeline(
                                node, name, io.commands, positions, io.asking, io.replies
                            )
                            for name, (node, positions) in io.groups.items()
                        )
                    )
                elif type(io) is Moved:
                    await manager.move_slot(io.error)
                elif type(io) is LoadScripts:
                    for script in io.scripts:
                        await io.node.execute_command("SCRIPT", "LOAD", script.source)
                elif type(io) is Refresh:
                    await manager.initialize()
                else:
                    await asyncio.sleep(TRYAGAIN_DELAY)
            except Exception as failed:
                steps.failed = failed
        return steps.result
