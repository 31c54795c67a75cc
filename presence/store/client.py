"""Connecting to Redis and running plans: the one failure policy of the store.

Every command goes through :meth:`PresenceStore.run` / :meth:`PresenceStore.arun`, which send a
plan as one pipeline (one round trip) and apply one failure policy: a Redis error is logged once
per outage, Redis is left alone for ``RETRY_INTERVAL`` seconds, and the plan's fallback is
returned (or :class:`StoreUnavailable` raised for plans that must not fail silently). Scripts
that Redis lost (restart, ``SCRIPT FLUSH``) are loaded again and only their commands re-sent.

Slowness is not an outage. Only a Redis that refuses, drops or cannot make a connection (within
``SOCKET_TIMEOUT``) is, or one that leaves the live paths (``arun(plan, live=True)``: consumers,
the hub, sweeps) without a reply for ``LIVE_SOCKET_TIMEOUT``: those wait for a busy Redis, so a
heartbeat is recorded late rather than lost. A page waits at most ``SOCKET_TIMEOUT`` for a
reply; past it the page gets the plan's fallback, and the others go on using Redis.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Generator, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
import redis.asyncio
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from presence.conf import PresenceSettings
from presence.store.cluster import ClusterRunner, NodeUnavailable
from presence.store.health import Health
from presence.store.plans import Plan, PlanBuilder, Raise
from presence.store.redact import redact_url
from presence.store.scripts import Script
from presence.users import UserId

T = TypeVar("T")

logger = logging.getLogger("presence")


def stale_connection_retry(retry_class: Any) -> Any:
    """redis-py's retry policy for presence's clients: once, at once, and only when the
    connection was lost (a pooled connection that a restarted Redis closed: the next one
    answers). Never on a timeout: a slow command may have run, and must not run twice; and a
    down Redis costs a page one short timeout, not several (our own failure policy)."""
    return retry_class(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


def is_slow_reply(error: BaseException) -> bool:
    """Whether ``error`` says only that a reply was late (the connection was made and the
    command sent): slowness, not an outage. redis-py raises TimeoutError for a connection that
    could not be made as well ("Timeout connecting ..."), which is an outage."""
    return isinstance(error, RedisTimeoutError) and "Timeout reading" in str(error)


def is_pool_exhausted(error: BaseException) -> bool:
    """Whether ``error`` says that every pooled connection stayed busy for the pool's whole
    wait (``LIVE_SOCKET_TIMEOUT``): more calls in flight than connections, each answered late
    (a busy Redis or a saturated process). Back-pressure, not an outage: Redis is answering
    those connections."""
    return isinstance(error, RedisConnectionError) and "No connection available" in str(error)


class StoreUnavailable(RuntimeError):
    """Redis could not be reached; raised only by operations that must not fail silently."""


REDIS_SCHEMES = frozenset({"redis", "rediss", "unix"})


def redis_location(cache_conf: dict[str, Any]) -> str | None:
    """The URL presence connects to: a django-redis cache's first (primary) location, or None
    when it is not a redis://, rediss:// or unix:// URL."""
    location = cache_conf.get("LOCATION")
    if isinstance(location, list | tuple):
        location = location[0] if location else None
    if isinstance(location, str):
        location = location.split(",")[0]
    if not isinstance(location, str) or urlsplit(location).scheme not in REDIS_SCHEMES:
        return None
    return location


class PresenceStore(PlanBuilder):
    """The store: its key scheme and plans (PlanBuilder), its clients, and running plans."""

    def __init__(self, conf: PresenceSettings) -> None:
        super().__init__(conf)
        self.health = Health()
        #: users this process claimed from the due schedule but could neither check nor put
        #: back (Redis failed in between): its next sweep checks them, so an outage loses nobody
        self.unswept: set[UserId] = set()
        self._client: redis.Redis | None = None
        self._async_clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, redis.asyncio.Redis
        ] = weakref.WeakKeyDictionary()
        #: on a Redis Cluster (REDIS_CLUSTER): sends each master its commands
        self.cluster: ClusterRunner | None = None
        if conf.REDIS_CLUSTER:
            self.cluster = ClusterRunner(
                conf.REDIS_CLUSTER,
                self._cluster_kwargs(),
                conf.RETRY_INTERVAL,
                live_timeout=conf.LIVE_SOCKET_TIMEOUT,
            )

    # --- clients ----------------------------------------------------------------------------

    def _connection_kwargs(self) -> tuple[str, dict[str, Any]]:
        caches = getattr(django_settings, "CACHES", {})
        try:
            cache_conf = caches[self.conf.CACHE_ALIAS]
        except KeyError:
            raise ImproperlyConfigured(
                f"PRESENCE['CACHE_ALIAS'] is {self.conf.CACHE_ALIAS!r}, which is not in CACHES "
                "(see presence.E004)."
            ) from None
        location = redis_location(cache_conf)
        if location is None:
            raise ImproperlyConfigured(
                f"CACHES[{self.conf.CACHE_ALIAS!r}]['LOCATION'] must be a redis:// URL."
            )
        options = cache_conf.get("OPTIONS", {})
        kwargs: dict[str, Any] = dict(options.get("CONNECTION_POOL_KWARGS", {}))
        if options.get("PASSWORD"):
            kwargs["password"] = options["PASSWORD"]
        kwargs["socket_timeout"] = options.get("SOCKET_TIMEOUT") or self.conf.SOCKET_TIMEOUT
        kwargs["socket_connect_timeout"] = (
            options.get("SOCKET_CONNECT_TIMEOUT") or self.conf.SOCKET_TIMEOUT
        )
        kwargs["decode_responses"] = True
        return location, kwargs

    def _cluster_kwargs(self) -> dict[str, Any]:
        return {
            "socket_timeout": self.conf.SOCKET_TIMEOUT,
            "socket_connect_timeout": self.conf.SOCKET_TIMEOUT,
            "decode_responses": True,
        }

    @property
    def client(self) -> redis.Redis:
        """The Redis client (on a cluster, redis-py's RedisCluster: the same commands)."""
        if self.cluster is not None:
            return self.cluster.client  # type: ignore[return-value]
        if self._client is None:
            location, kwargs = self._connection_kwargs()
            kwargs["retry"] = stale_connection_retry(Retry)
            self._client = redis.Redis.from_url(location, **kwargs)
        return self._client

    @property
    def async_client(self) -> redis.asyncio.Redis:
        """This event loop's client (on a cluster, redis.asyncio's RedisCluster)."""
        if self.cluster is not None:
            return self.cluster.async_client()  # type: ignore[return-value]
        # redis.asyncio connections belong to one event loop.
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            from redis.asyncio.retry import Retry as AsyncRetry

            location, kwargs = self._connection_kwargs()
            kwargs["retry"] = stale_connection_retry(AsyncRetry)
            # The live paths wait for a busy Redis (pages cut their own wait short, see arun),
            # and for a busy event loop: a saturated process reaches a new connection's
            # handshake late though Redis answered it at once. A refused connection still
            # fails at once; a Redis that cannot be reached, after LIVE_SOCKET_TIMEOUT.
            live_timeout = max(self.conf.LIVE_SOCKET_TIMEOUT, kwargs["socket_timeout"])
            kwargs["socket_timeout"] = live_timeout
            kwargs["socket_connect_timeout"] = max(live_timeout, kwargs["socket_connect_timeout"])
            # Many connections of one process write at once: past the pool's size, wait for a
            # connection instead of failing ("Too many connections" would look like an outage).
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                location,
                max_connections=kwargs.pop("max_connections", 100),
                timeout=live_timeout,
                **kwargs,
            )
            client = redis.asyncio.Redis(connection_pool=pool)
            self._async_clients[loop] = client
        return client

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

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        if self.cluster is not None:
            await self.cluster.aclose()
        loop = asyncio.get_running_loop()
        client = self._async_clients.pop(loop, None)
        if client is not None:
            await client.aclose()

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

    @staticmethod
    def _fallback(plan: Plan[T], error: Exception | None = None) -> T:
        if isinstance(plan.fallback, Raise):
            reason = redact_url(str(error)) if error else "in an outage, retrying shortly"
            raise StoreUnavailable(f"Redis is unavailable: {reason}") from error
        return plan.fallback

    # When Redis has lost its scripts (restart, SCRIPT FLUSH, or another client loading them
    # half-way through our pipeline), the other commands of the pipeline have run already: only
    # the refused ones are sent again, after loading their scripts, so no command runs twice.

    def _execute(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        with self.client.pipeline(transaction=False) as pipe:
            self._queue(pipe, commands)
            return list(pipe.execute(raise_on_error=False))

    async def _aexecute(
        self, client: redis.asyncio.Redis, commands: Sequence[tuple[Any, ...]]
    ) -> list[Any]:
        async with client.pipeline(transaction=False) as pipe:
            self._queue(pipe, commands)
            return list(await pipe.execute(raise_on_error=False))

    def _cluster_result(self, plan: Plan[T], replies: list[Any]) -> T:
        """A plan's result from the masters' replies: read in full, read partly (a master
        unavailable, the plan reads what the others hold), or its fallback."""
        unavailable = [r for r in replies if isinstance(r, NodeUnavailable)]
        if not unavailable:
            self._raise_first_error(replies)
            return plan.parse(replies)
        for reply in replies:
            if isinstance(reply, Exception) and not isinstance(reply, NodeUnavailable):
                raise reply
        if plan.partial is not None and len(unavailable) < len(replies):
            return plan.partial(replies)
        return self._fallback(plan, unavailable[0])

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
            retried = yield [commands[i] for i in missing]
            for i, reply in zip(missing, retried, strict=True):
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
                result = self._cluster_result(plan, self.cluster.execute(plan.commands))
            except (RedisError, RedisClusterException, OSError) as error:
                return self._failed(plan, error)
            self.health.succeeded()
            return result
        try:
            steps = self._replies(plan.commands)
            step = next(steps)
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
            return await self._arun(plan)
        try:
            async with asyncio.timeout(self.conf.SOCKET_TIMEOUT):
                return await self._arun(plan)
        except TimeoutError as error:
            # The wait was cut short here; the connection it left is dropped by redis-py.
            return self._late(plan, error)

    async def _arun(self, plan: Plan[T]) -> T:
        if self.cluster is not None:
            try:
                result = self._cluster_result(plan, await self.cluster.aexecute(plan.commands))
            except (RedisError, RedisClusterException, OSError) as error:
                return self._failed(plan, error)
            self.health.succeeded()
            return result
        try:
            client = self.async_client
            steps = self._replies(plan.commands)
            step = next(steps)
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
