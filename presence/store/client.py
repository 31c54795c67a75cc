"""The store: its key scheme and plans, its clients (:mod:`.connecting`) and health, and running
plans under its one failure policy.

A plan is built, then run: ``store.run(store.plans.touch(user_id, device, now))``. Every command
goes through :meth:`PresenceStore.run` / :meth:`PresenceStore.arun`, which send a plan as one
pipeline (one round trip) and apply one failure policy: a Redis error is logged once per outage,
Redis is left alone for ``RETRY_INTERVAL`` seconds, and the plan's fallback is returned (or
:class:`StoreUnavailable` raised for plans that must not fail silently). Scripts that Redis lost
(restart, ``SCRIPT FLUSH``) are loaded again and their commands re-sent, with the reads after
them (never a write that ran). Nothing else is sent twice: a call whose connection is lost once
its commands were sent fails (Redis may have run them); a pooled connection Redis closed before
is replaced when taken, before anything is sent (presence.store.connecting.no_retry).

Slowness is not an outage. Only a Redis that refuses, drops or cannot make a connection (within
``SOCKET_TIMEOUT``) is, or one that leaves the live paths (``arun(plan, live=True)``: consumers,
the hub, sweeps) without a reply for ``LIVE_SOCKET_TIMEOUT``: those wait for a busy Redis, so a
heartbeat is recorded late rather than lost. A page waits at most ``SOCKET_TIMEOUT`` for a
reply; past it the page gets the plan's fallback, and the others go on using Redis.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError

from presence import metrics
from presence.conf import PresenceSettings
from presence.gathering import Gathering, split_as
from presence.store.connecting import (
    REDIS_SCHEMES,
    Connections,
    redis_location,
    stale_connection_retry,
)
from presence.store.health import Health, is_slow_reply
from presence.store.keys import KeyScheme
from presence.store.plans import Plan, Plans, Raise
from presence.store.plans.plan import reads_only
from presence.store.redact import redact_url
from presence.store.scripts import Script
from presence.users import UserId

__all__ = [
    "REDIS_SCHEMES",
    "PresenceStore",
    "StoreUnavailable",
    "is_pool_exhausted",
    "is_slow_reply",
    "redis_location",
    "stale_connection_retry",
]

T = TypeVar("T")

logger = logging.getLogger("presence")


def is_pool_exhausted(error: BaseException) -> bool:
    """Whether ``error`` says that every pooled connection stayed busy for the pool's whole
    wait (``LIVE_SOCKET_TIMEOUT``): more calls in flight than connections, each answered late
    (a busy Redis or a saturated process). Back-pressure, not an outage: Redis is answering
    those connections."""
    return isinstance(error, RedisConnectionError) and "No connection available" in str(error)


class StoreUnavailable(RuntimeError):
    """Redis could not be reached; raised only by operations that must not fail silently."""


class PresenceStore:
    """The store: its key scheme (``keys``) and plans (``plans``: building one does no I/O),
    its clients and the health of Redis, and running plans under the one failure policy
    (:meth:`run`, :meth:`arun`): ``store.run(store.plans.touch(user_id, device, now))``."""

    def __init__(self, conf: PresenceSettings) -> None:
        self.conf = conf
        self.keys = KeyScheme(conf)
        self.plans = Plans(self.keys)
        #: Redis's health (on a cluster, the cluster's as a client; each master has its own)
        self.health = Health()
        self._connections = Connections(conf)
        #: on a Redis Cluster (REDIS_CLUSTER): sends each master its commands
        self.cluster = self._connections.cluster
        #: users this process claimed from the due schedule but could neither check nor put
        #: back (Redis failed in between): its next sweep checks them, so an outage loses nobody
        self.unswept: set[UserId] = set()
        #: how many calls were answered with their fallback (or partly, a cluster's master
        #: unavailable) so far: a page whose reads met one shows guesses, and carries no stamp
        #: (presence.stamps.page_stamp)
        self.guesses = 0
        #: each event loop's PING after a page's call was cut short, while under way
        self._asking: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Future[Any]] = (
            weakref.WeakKeyDictionary()
        )

    # --- its clients and health -------------------------------------------------------------

    @property
    def client(self) -> redis.Redis:
        """The Redis client (on a cluster, redis-py's RedisCluster: the same commands)."""
        return self._connections.client

    @property
    def async_client(self) -> redis.asyncio.Redis:
        """This event loop's client (on a cluster, redis.asyncio's RedisCluster)."""
        return self._connections.async_client

    def known_down(self) -> bool:
        """Whether Redis (the whole of it: one server, or the cluster as a client) failed last
        time and is left alone until RETRY_INTERVAL passes: a read now answers its fallback at
        once."""
        return not self.health.available()

    def recoveries(self) -> int:
        """Outages that ended so far: of Redis, or of any cluster master."""
        if self.cluster is None:
            return self.health.recoveries
        return self.health.recoveries + sum(
            health.recoveries for health in self.cluster.node_health.values()
        )

    def scan_keys(self, pattern: str, count: int = 1000) -> tuple[list[Any], list[str]]:
        """The keys matching ``pattern`` (SCAN, ``COUNT count``), and on a cluster the masters
        that could not be read, whose keys are left out (each master's outage its own).
        StoreUnavailable when Redis (every master) cannot be read."""
        try:
            if self.cluster is None:
                return list(self.client.scan_iter(match=pattern, count=count)), []
            keys, unavailable = self.cluster.scan_masters(pattern, count)
        except (RedisError, RedisClusterException, OSError) as error:
            raise StoreUnavailable(f"Redis is unavailable: {redact_url(str(error))}") from error
        return keys, unavailable

    def masters_of(self, keys: Iterable[str]) -> list[str]:
        """The cluster masters holding these keys, by the slot table as last read (to name
        what an unavailable master left undone); [] on one Redis."""
        if self.cluster is None:
            return []
        return sorted({self.cluster.master_of(key) for key in keys})

    def close(self) -> None:
        self._connections.close()

    async def aclose(self) -> None:
        asking = [future for future in self._asking.values() if not future.done()]
        for future in asking:
            future.cancel()
        await asyncio.gather(*asking, return_exceptions=True)
        await self._connections.aclose()

    # --- executing plans --------------------------------------------------------------------

    @staticmethod
    def _queue(pipe: Any, commands: Sequence[tuple[Any, ...]]) -> None:
        for command in commands:
            if command[0] == "SCRIPT":
                _, script, keys, args = command
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            else:
                pipe.execute_command(*command)

    @staticmethod
    def _without_script(replies: list[Any]) -> list[int]:
        """Positions of the commands Redis refused for not knowing their script."""
        return [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]

    @staticmethod
    def _raise_first_error(replies: list[Any]) -> None:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

    def _failed(self, plan: Plan[T], error: Exception) -> T:
        self.health.failed(error, self.conf.RETRY_INTERVAL)
        return self._fallback(plan, error)

    def _fallback(self, plan: Plan[T], error: Exception | None = None) -> T:
        if isinstance(plan.fallback, Raise):
            reason = redact_url(str(error)) if error else "in an outage, retrying shortly"
            raise StoreUnavailable(f"Redis is unavailable: {reason}") from error
        self.guesses += 1
        return plan.fallback

    # When Redis has lost scripts (restart, failover, SCRIPT FLUSH), the commands it refused
    # did not run, and those after them did, without their writes: Redis may have lost some of
    # a plan's scripts and not others (another process loaded those since), and a read after
    # a refused write (a join's room read after its join) would read the room without it. From
    # the first refused command on, the plan runs again in its order once the scripts are
    # loaded: each refused command, and each read (run again, it changes nothing, and now reads
    # the writes before it). A write that ran is never sent again (no write runs twice).

    def _execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        if len(commands) == 1:
            # One command (a room's join or leave, most reads): sent as itself, without a
            # pipeline's bookkeeping (a fifth of a join's time in the client).
            started = time.perf_counter()
            try:
                replies = [self.client.execute_command(*_wire(commands[0]))]
            except ResponseError as error:
                replies = [error]
            metrics.redis_round_trip("redis", time.perf_counter() - started)
            return replies
        with self.client.pipeline(transaction=False) as pipe:
            self._queue(pipe, commands)
            started = time.perf_counter()
            replies = list(pipe.execute(raise_on_error=False))
        metrics.redis_round_trip("redis", time.perf_counter() - started)
        return replies

    async def _aexecute(
        self, client: redis.asyncio.Redis, commands: Sequence[tuple[Any, ...]]
    ) -> list[Any]:
        async with client.pipeline(transaction=False) as pipe:
            self._queue(pipe, commands)
            started = time.perf_counter()
            replies = list(await pipe.execute(raise_on_error=False))
        metrics.redis_round_trip("redis", time.perf_counter() - started)
        return replies

    def _cluster_result(self, plan: Plan[T], replies: list[Any]) -> T:
        """A plan's result from the masters' replies: read in full, read partly (a master
        unavailable, the plan reads what the others hold), or its fallback. A command a master
        refused is that master's outage (presence.store.rounds), or this plan's alone (a slot
        still moving): never the cluster's, whose other masters go on answering."""
        failed = [reply for reply in replies if isinstance(reply, Exception)]
        if not failed:
            return plan.parse(replies)
        if plan.partial is not None and len(failed) < len(replies):
            self.guesses += 1  # (what the unavailable masters hold is guessed)
            return plan.partial(replies)
        return self._fallback(plan, failed[0])

    def _replies(
        self, commands: Sequence[tuple[Any, ...]]
    ) -> Generator[Sequence[tuple[Any, ...]] | Script, Any, list[Any]]:
        """The replies of ``commands`` on one Redis, written once for both faces: yields the
        commands to send as one pipeline (answered with their replies) and the scripts to
        load (Redis lost them); raises the first error a command answered."""
        replies: list[Any] = yield commands
        missing = self._without_script(replies)
        if missing:
            yield from {commands[i][1] for i in missing}
            again = [
                i
                for i in range(missing[0], len(commands))
                if isinstance(replies[i], NoScriptError) or reads_only(commands[i])
            ]
            retried = yield [commands[i] for i in again]
            for i, reply in zip(again, retried, strict=True):
                replies[i] = reply
        self._raise_first_error(replies)
        return replies

    def run(self, plan: Plan[T]) -> T:
        if not plan.commands:
            return plan.parse([])
        if not self.health.available():
            return self._fallback(plan)
        if self.cluster is not None:
            try:
                result = self._cluster_result(plan, self.cluster.execute(plan.commands, plan.needs))
            except (RedisError, RedisClusterException, OSError) as error:
                return self._failed(plan, error)
            self.health.succeeded()
            return result
        return self._finish(plan, None)

    def begin(self, plan: Plan[T]) -> Callable[[], T]:
        """A read's plan sent now; returns what reads its replies (:meth:`run`'s result). The
        caller does other blocking work meanwhile (a database query), in this thread, while
        Redis runs the commands: the sync face of two steps at once (a thread would contend
        for the GIL). On a cluster, with Redis known down, or when the commands cannot be
        sent (a stale pooled connection), the plan runs when its result is asked for."""
        if self.cluster is not None or not plan.commands or not self.health.available():
            return lambda: self.run(plan)
        try:
            sent = _Sent(self.client, plan.commands)
        except (RedisError, OSError):
            return lambda: self.run(plan)
        return lambda: self._finish(plan, sent)

    def _finish(self, plan: Plan[T], sent: _Sent | None) -> T:
        """:meth:`run` on one Redis; ``sent``: the plan's commands sent already (:meth:`begin`),
        their replies read first."""
        try:
            steps = self._replies(plan.commands)
            step = next(steps)
            if sent is not None:
                step = steps.send(sent.replies())
            while True:
                if isinstance(step, Script):
                    self.client.script_load(step.source)
                    step = next(steps)
                else:
                    step = steps.send(self._execute(step))
        except StopIteration as done:
            replies = done.value
        except RedisError as error:
            if is_slow_reply(error):
                return self._late(plan, error)
            return self._failed(plan, error)
        self.health.succeeded()
        return plan.parse(replies)

    def _late(self, plan: Plan[T], error: Exception) -> T:
        """A page's reply was late, or a live call found every pooled connection busy: this
        call gets the fallback; Redis is not in an outage."""
        if is_pool_exhausted(error):
            late = "every pooled connection busy for the pool's whole wait (LIVE_SOCKET_TIMEOUT)"
        else:
            late = f"no reply within SOCKET_TIMEOUT ({self.conf.SOCKET_TIMEOUT} s)"
        logger.info(
            "Presence: Redis is slow: %s (%s).",
            late,
            redact_url(str(error)) if error else "cut short here",
        )
        if isinstance(plan.fallback, Raise):
            raise StoreUnavailable(f"Redis is too slow: {late}") from error
        self.guesses += 1
        return plan.fallback

    async def arun(self, plan: Plan[T], *, live: bool = False) -> T:
        """:meth:`run` on this event loop. ``live``: a call of the live paths (consumers, the
        hub, sweeps), which waits up to ``LIVE_SOCKET_TIMEOUT`` for a busy Redis; otherwise a
        page's call, which waits at most ``SOCKET_TIMEOUT``."""
        if not plan.commands:
            return plan.parse([])
        if not self.health.available():
            return self._fallback(plan)
        if live:
            # On one Redis, a live plan shares its round trip with the others of this moment.
            return await self._arun(plan, batched=self.cluster is None)
        try:
            async with asyncio.timeout(self.conf.SOCKET_TIMEOUT):
                return await self._arun(plan)
        except TimeoutError as error:
            # The wait was cut short here; the connection it left is dropped by redis-py.
            self._ask_as_the_live_paths_do()
            return self._late(plan, error)

    def _ask_as_the_live_paths_do(self) -> None:
        """A page's call was cut short, maybe while it waited for a connection that cannot
        be made (this loop's client waits the live paths' LIVE_SOCKET_TIMEOUT to connect,
        longer than a page waits): one PING at a time per event loop asks Redis as a live call
        does, so an unreachable Redis is an outage (the failure policy: logged once, pages
        answered at once for RETRY_INTERVAL) and a merely busy one is not."""
        if self.cluster is not None:
            return  # (each master's health is its own, presence.store.cluster)
        loop = asyncio.get_running_loop()
        asking = self._asking.get(loop)
        if asking is not None and not asking.done():
            return
        ping = Plan(commands=[("PING",)], parse=lambda replies: True, fallback=False)
        asking = self._asking[loop] = asyncio.ensure_future(self.arun(ping, live=True))
        # (a finished PING lets go of its loop: the task refers to it)
        asking.add_done_callback(lambda _: self._asking.pop(loop, None))

    async def _arun(self, plan: Plan[T], batched: bool = False) -> T:
        if self.cluster is not None:
            try:
                result = self._cluster_result(
                    plan, await self.cluster.aexecute(plan.commands, plan.needs)
                )
            except (RedisError, RedisClusterException, OSError) as error:
                return self._failed(plan, error)
            self.health.succeeded()
            return result
        try:
            client = self.async_client
            steps = self._replies(plan.commands)
            step = next(steps)
            if batched:
                # The plan's commands go with the other live plans of this moment (one
                # pipeline, see _Batches); a script Redis lost is loaded and resent below.
                assert not isinstance(step, Script)
                step = steps.send(await _Batches.of(self, client).ask(step))
            while True:
                if isinstance(step, Script):
                    await client.script_load(step.source)
                    step = next(steps)
                else:
                    step = steps.send(await self._aexecute(client, step))
        except StopIteration as done:
            replies = done.value
        except (RedisError, OSError) as error:
            if is_pool_exhausted(error):
                return self._late(plan, error)
            return self._failed(plan, error)
        self.health.succeeded()
        return plan.parse(replies)


class _Batches(Gathering[Sequence[tuple[Any, ...]], list[Any]]):
    """The live plans of one event loop's moment, sent to one Redis as one pipeline: a
    saturated process has many sockets writing at once (page views opening, subscribing and
    closing), and each round trip of its own cost a write to the socket, a read, and the
    pipeline's and the pool's bookkeeping, a fifth of a page view's time. Each caller gets its
    own commands' replies (errors among them: a script Redis lost is loaded and resent by its
    caller alone), or the pipeline's exception."""

    def __init__(self, store: PresenceStore, client: redis.asyncio.Redis) -> None:
        super().__init__(self._send)
        self.store = store
        self.client = client

    @classmethod
    def of(cls, store: PresenceStore, client: redis.asyncio.Redis) -> _Batches:
        batches = _batches.get(client)
        if batches is None or batches.store is not store:
            batches = _batches[client] = cls(store, client)
        return batches

    async def _send(self, parts: list[Sequence[tuple[Any, ...]]]) -> list[list[Any]]:
        replies = await self.store._aexecute(
            self.client, [command for part in parts for command in part]
        )
        return split_as(parts, replies)


#: each event loop's client (redis.asyncio clients belong to one loop) -> its batches
_batches: weakref.WeakKeyDictionary[redis.asyncio.Redis, _Batches] = weakref.WeakKeyDictionary()


def _wire(command: tuple[Any, ...]) -> tuple[Any, ...]:
    """A plan's command as Redis takes it (a script's: EVALSHA)."""
    if command[0] == "SCRIPT":
        _, script, keys, args = command
        return ("EVALSHA", script.sha, len(keys), *keys, *args)
    return command


class _Sent:
    """Commands written to one Redis as a pipeline, their replies read later (:meth:`replies`),
    on a pooled connection held meanwhile."""

    def __init__(self, client: redis.Redis, commands: Sequence[tuple[Any, ...]]) -> None:
        self.client = client
        self.pool = client.connection_pool
        self.connection = self.pool.get_connection()
        wire = [_wire(command) for command in commands]
        self.names = [str(command[0]) for command in wire]
        try:
            self.connection.send_packed_command(self.connection.pack_commands(wire))
        except BaseException:
            self.connection.disconnect()
            self.pool.release(self.connection)
            raise
        self.started = time.perf_counter()

    def replies(self) -> list[Any]:
        """The replies, a command's error in its place (as a pipeline's ``raise_on_error=False``);
        a lost or late connection raises, and is dropped (a late reply must not answer the
        next command sent on it)."""
        replies: list[Any] = []
        try:
            for name in self.names:
                try:
                    replies.append(self.client.parse_response(self.connection, name))
                except ResponseError as error:
                    replies.append(error)
        except BaseException:
            self.connection.disconnect()
            raise
        finally:
            self.pool.release(self.connection)
        metrics.redis_round_trip("redis", time.perf_counter() - self.started)
        return replies
