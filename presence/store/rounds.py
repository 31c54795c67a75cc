"""The rounds of one plan on a Redis Cluster, written once: routing each command to the master
of its slot, reading what the masters answered (MOVED, ASK, TRYAGAIN, NOSCRIPT, CLUSTERDOWN),
and the next round, as a generator of the I/O steps they need. No I/O here:
:class:`presence.store.cluster.ClusterRunner` does the steps, in this thread or on the event loop.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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

from presence.store.nodes import ClusterNodes, NodeUnavailable, first_key
from presence.store.plans.plan import reads_only

#: rounds of MOVED / ASK / TRYAGAIN / NOSCRIPT answers followed for one plan
MAX_REDIRECTS = 5
#: pause before re-sending a command refused with TRYAGAIN (a slot half-migrated)
TRYAGAIN_DELAY = 0.02
#: a script Redis stopped at a key its master no longer holds (a key the script built, not
#: declared, whose slot is migrating): Redis 6 and 7 say "non local key", Valkey alike
_NON_LOCAL_KEY = re.compile(r"non[ -]local key", re.IGNORECASE)


@dataclass(frozen=True)
class Refresh:
    """Read the slot table again (a master failed since the last plan)."""


@dataclass(frozen=True)
class Exchange:
    """Send each master its pipeline of ``groups`` and read the replies into ``replies``."""

    groups: dict[str, tuple[Any, list[int]]]
    commands: Sequence[tuple[Any, ...]]
    asking: dict[int, tuple[str, int]]
    replies: list[Any]


@dataclass(frozen=True)
class Moved:
    """Update the slot table with a MOVED answer."""

    error: MovedError


@dataclass(frozen=True)
class LoadScripts:
    """Load these scripts on this master (it answered NOSCRIPT)."""

    node: Any
    scripts: set[Any]


@dataclass(frozen=True)
class Pause:
    """Wait TRYAGAIN_DELAY before the next round (a slot half-migrated)."""


Step = Refresh | Exchange | Moved | LoadScripts | Pause


class ClusterRounds(ClusterNodes):
    """The rounds of a plan's commands over the masters of a Redis Cluster."""

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
            elif isinstance(reply, ResponseError) and _NON_LOCAL_KEY.search(str(reply)):
                # Its slot is moving, as for a command still redirected: unknown to this plan
                # alone, no outage of the master. Not sent again: the script may have written
                # before Redis stopped it (Redis keeps those writes), and no write runs twice.
                self.redirects["moving"] += 1
                replies[position] = NodeUnavailable(f"{node_name}: its slot is moving: {reply}")
            elif isinstance(reply, ResponseError):
                # The master refused the command (out of memory, loading, read-only, busy): an
                # outage of that master, as of one Redis that refuses, not of the cluster.
                replies[position] = self._node_failed(node_name, reply)
        return again, moved

    # --- the rounds, written once -------------------------------------------------------------

    def _rounds(
        self,
        manager: Any,
        commands: Sequence[tuple[Any, ...]],
        needs: Mapping[int, int] | None = None,
    ) -> Generator[Any, Any, list[Any]]:
        """Each command's reply, or the exception it raised (NodeUnavailable for an
        unreachable master), in order: the rounds of one plan, as a generator of the I/O they
        need (:class:`Refresh`, :class:`Exchange`, :class:`Moved`, :class:`LoadScripts`,
        :class:`Pause`), which :meth:`execute` does in this thread and :meth:`aexecute` on the
        event loop. ``needs`` (``Plan.needs``): a command sent only once an earlier one
        succeeded, in a later round."""
        if self._stale_topology:
            self._stale_topology = False
            try:
                yield Refresh()
            except (RedisError, RedisClusterException, OSError):
                self._stale_topology = True
        replies: list[Any] = [None] * len(commands)
        needs = needs or {}
        for phase in _phases(commands, needs):
            pending = []
            for position in phase:
                first = needs.get(position)
                if first is not None and isinstance(replies[first], Exception):
                    replies[position] = NodeUnavailable(
                        f"not sent: the command it needs first failed ({replies[first]})"
                    )
                else:
                    pending.append(position)
            if pending:
                yield from self._redirected(manager, commands, pending, replies)
        return replies

    def _redirected(
        self,
        manager: Any,
        commands: Sequence[tuple[Any, ...]],
        pending: list[int],
        replies: list[Any],
    ) -> Generator[Any, Any, None]:
        """The rounds of these commands, each re-sent where the cluster redirects it."""
        asking: dict[int, tuple[str, int]] = {}
        for attempt in range(MAX_REDIRECTS):
            groups = self._route(manager, commands, pending, asking, replies)
            scripts_to_load: dict[str, set[Any]] = defaultdict(set)
            yield Exchange(groups, commands, asking, replies)
            pending = []
            any_tryagain = False
            for name, (_, positions) in groups.items():
                again, moved = self._settle(
                    commands, positions, name, replies, asking, scripts_to_load
                )
                for error in moved:
                    yield Moved(error)
                any_tryagain |= any(isinstance(replies[p], TryAgainError) for p in again)
                pending += again + _reads_after_refused(commands, positions, replies, again)
            pending.sort()  # (each slot's commands in the plan's order)
            for name, scripts in scripts_to_load.items():
                node = manager.get_node(node_name=name)
                if node is None:
                    continue  # the node left the cluster: the next round routes elsewhere
                try:
                    yield LoadScripts(node, scripts)
                except (RedisError, OSError) as error:
                    # The master went away while loading them: its commands are unavailable.
                    unavailable = self._node_failed(name, error)
                    sent_there = set(groups[name][1])
                    for position in [
                        p
                        for p in pending
                        if p in sent_there and isinstance(replies[p], NoScriptError)
                    ]:
                        replies[position] = unavailable
                        pending.remove(position)
            if not pending:
                break
            if any_tryagain and attempt < MAX_REDIRECTS - 1:
                yield Pause()
        for position in pending:
            # Still redirected after MAX_REDIRECTS rounds (a slot moving): unknown to this
            # plan alone; no master is in an outage.
            replies[position] = NodeUnavailable(
                f"still redirected after {MAX_REDIRECTS} rounds: {replies[position]}"
            )


def _reads_after_refused(
    commands: Sequence[tuple[Any, ...]],
    positions: Sequence[int],
    replies: list[Any],
    again: Sequence[int],
) -> list[int]:
    """The reads of one master's pipeline (``positions``, in the plan's order) that ran after a
    command of their slot the master refused with NOSCRIPT: sent again after it, they read its
    writes (a join's room read after its join; run again, a read changes nothing). A write
    that ran is never sent again."""
    resent = set(again)
    refused_slots: set[int] = set()
    reads: list[int] = []
    for position in positions:
        slot = key_slot(first_key(commands[position]).encode())
        if isinstance(replies[position], NoScriptError):
            refused_slots.add(slot)
        elif slot in refused_slots and position not in resent and reads_only(commands[position]):
            reads.append(position)
    return reads


def _phases(commands: Sequence[tuple[Any, ...]], needs: Mapping[int, int]) -> list[list[int]]:
    """The commands' positions by the round they may go in: a command that needs another goes
    in a round after it, and every later command of its slot with it (Redis runs a slot's
    commands in the plan's order: a read after a write reads it)."""
    if not needs:
        return [list(range(len(commands)))]
    phase_of: list[int] = []
    slot_phase: dict[int, int] = {}
    for position, command in enumerate(commands):
        slot = key_slot(first_key(command).encode())
        phase = slot_phase.get(slot, 0)
        first = needs.get(position)
        if first is not None:
            assert first < position, "a command needs an earlier one"
            phase = max(phase, phase_of[first] + 1)
        phase_of.append(phase)
        slot_phase[slot] = phase
    phases: list[list[int]] = [[] for _ in range(max(phase_of) + 1)]
    for position, phase in enumerate(phase_of):
        phases[phase].append(position)
    return phases
