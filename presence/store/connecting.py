"""The store's connections: its Redis client (one per process), its async clients (one per
event loop), or on a Redis Cluster its :class:`~presence.store.cluster.ClusterRunner`, built from
``CACHES`` and ``PRESENCE``. :class:`~presence.store.client.PresenceStore` holds them and runs
plans on them.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from presence.conf import PresenceSettings
from presence.store.cluster import ClusterRunner
from presence.store.health import drop_if_closed
from presence.store.redact import redact_url
from presence.store.sharing import publish_once

try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis])
    _hiredis_pack = None  # type: ignore[assignment]


def no_retry(retry_class: Any) -> Any:
    """redis-py's retry policy for the store's clients: none. A command whose connection was
    lost after it was sent may have run (Redis ran it, and its reply was lost with the
    connection): sent again, a write would run twice (a rate limit counting one request twice,
    a touch whose second run finds the user online already while the first's transition is
    left unannounced). A pooled connection Redis closed before (a restart, a proxy's idle
    timeout) is found when it is taken from the pool, before anything is sent on it, and
    replaced: redis-py's sync pool reads the socket then, :class:`CheckedConnectionPool` polls
    the asyncio one's, the cluster's pipelines their node's (health.closed_by_peer). Never on
    a timeout either: a slow command may have run; and a down Redis costs a page one short
    timeout, not several (our own failure policy)."""
    return retry_class(NoBackoff(), 0)


def stale_connection_retry(retry_class: Any) -> Any:
    """A retry policy of once, at once, when the connection was lost: for a command that
    changes nothing however often it runs (the health check's PING), never for the store's
    (:func:`no_retry`)."""
    return retry_class(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


class CheckedConnectionPool(redis.asyncio.BlockingConnectionPool):
    """redis.asyncio's blocking pool, each connection it hands out checked first for a close
    Redis made since it was released (health.closed_by_peer): replaced then, before anything
    is sent on it, as redis-py's sync pool does. The pool's own check reads only what the
    event loop has seen of the socket so far."""

    async def ensure_connection(self, connection: Any) -> None:
        await drop_if_closed(connection)
        await super().ensure_connection(connection)


#: connection class -> its subclass packing commands with hiredis (see hiredis_packing)
_packing: dict[type, type] = {}


def hiredis_packing(connection_class: type) -> type:
    """``connection_class`` (redis-py's sync or asyncio one) packing its commands in C with
    hiredis: redis-py 8 encodes each argument in Python first (its sync connections too), and a
    page view's few pipelines of a hundred-odd arguments cost more to pack so than Redis takes
    to run them (a room's read: a sixth of its time). A command hiredis refuses (an argument
    of no type it packs) is packed as before, which raises redis-py's own DataError for it."""
    if _hiredis_pack is None:  # pragma: no cover
        return connection_class
    packing = _packing.get(connection_class)
    if packing is None:
        pack = _hiredis_pack

        def words(args: tuple[Any, ...]) -> tuple[Any, ...]:
            # As redis-py's: "CONFIG GET" names are split into their words.
            if isinstance(args[0], str):
                return (*args[0].encode().split(), *args[1:])
            if b" " in args[0]:
                return (*args[0].split(), *args[1:])
            return args

        def pack_command(self: Any, *args: Any) -> list[bytes]:
            try:
                return [pack(words(args))]
            except TypeError:
                return python_pack(self, *args)

        def pack_commands(self: Any, commands: Any) -> list[bytes]:
            try:
                return [b"".join([pack(words(tuple(command))) for command in commands])]
            except TypeError:
                return python_pack_commands(self, commands)

        def send_command(self: Any, *args: Any, **kwargs: Any) -> None:
            # redis-py's sync send_command packs with its own packer, not pack_command: a
            # single command (a room's join or leave) was still encoded in Python
            self.send_packed_command(
                self.pack_command(*args), check_health=kwargs.get("check_health", True)
            )

        python_pack: Callable[..., list[bytes]] = connection_class.pack_command  # type: ignore[attr-defined]
        python_pack_commands: Callable[..., list[bytes]] = connection_class.pack_commands  # type: ignore[attr-defined]
        methods: dict[str, Any] = {"pack_command": pack_command, "pack_commands": pack_commands}
        if not inspect.iscoroutinefunction(connection_class.send_command):  # type: ignore[attr-defined]
            methods["send_command"] = send_command
        packing = type(connection_class.__name__, (connection_class,), methods)
        _packing[connection_class] = packing
    return packing


def _pack_in_c(pool: Any) -> None:
    """``pool``'s connections (sync or asyncio) pack with hiredis, which packs str as UTF-8,
    as redis-py does unless told another encoding (then they stay as they are)."""
    if pool.connection_kwargs.get("encoding", "utf-8").lower() in ("utf-8", "utf8"):
        pool.connection_class = hiredis_packing(pool.connection_class)


REDIS_SCHEMES = frozenset({"redis", "rediss", "unix"})
CLUSTER_SCHEMES = frozenset({"redis", "rediss"})


def redis_url_problem(url: Any, *, cluster: bool = False) -> str | None:
    """Why ``url`` is not a URL presence can connect to, or None: one Redis's (redis://,
    rediss:// or unix://) or, with ``cluster``, a Redis Cluster startup node's (redis:// or
    rediss://, with host and port, database 0). Read now, without network I/O: redis-py reads
    the port and database only at the first connection, and raises there, on every request."""
    # Never the URL itself: it may carry a password (printed by manage.py check, in CI logs).
    shown = redact_url(repr(url))
    if not isinstance(url, str):
        return f"{shown} is not a string"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        # Not the error's text: urlsplit quotes the piece it failed on, maybe of the password.
        return (
            f"{shown} is not a URL: its host or port cannot be read (percent-encode any "
            "/ ? # @ [ ] in a user name or password)"
        )
    schemes = CLUSTER_SCHEMES if cluster else REDIS_SCHEMES
    if parts.scheme not in schemes:
        *others, last = (f"{scheme}://" for scheme in sorted(schemes))
        return f"{shown} is not a {', '.join(others)} or {last} URL"
    if parts.scheme == "unix":
        return None
    database = parts.path.strip("/")
    if cluster:
        if not parts.hostname:
            return f"{shown} has no host"
        if port is None:
            return f"{shown} has no port"
        if database not in {"", "0"}:
            return f"{shown} names database {database!r}; a cluster has only database 0"
    elif database and not database.isdigit():
        return f"{shown} names database {database!r}, which is not a number"
    return None


def primary_location(cache_conf: dict[str, Any]) -> Any:
    """A django-redis cache's first (primary) ``LOCATION``, as given: a list's first item or a
    comma-separated string's first URL (None when there is none)."""
    location = cache_conf.get("LOCATION")
    if isinstance(location, list | tuple):
        location = location[0] if location else None
    if isinstance(location, str):
        location = location.split(",")[0]
    return location


def redis_location(cache_conf: dict[str, Any]) -> str | None:
    """The URL presence connects to: a django-redis cache's primary location, or None when it
    is not a redis://, rediss:// or unix:// URL (see :func:`redis_url_problem`)."""
    location = primary_location(cache_conf)
    return location if redis_url_problem(location) is None else None


class Connections:
    """The store's clients, made when first asked for (on a cluster, its runner's)."""

    def __init__(self, conf: PresenceSettings) -> None:
        self.conf = conf
        #: where its clients connect, read from CACHES once, as the store is built: a client
        #: made later (the first on an event loop, or one asked for by a thread still holding
        #: a store replaced since) reaches the same Redis, never one CACHES names meanwhile
        self._target: tuple[str, dict[str, Any]] | ImproperlyConfigured
        try:
            self._target = self._read_target()
        except ImproperlyConfigured as error:
            self._target = error  # raised when a client is asked for (presence.E004)
        self._client: redis.Redis | None = None
        #: one client handed out at a time, whatever the threads asking for it first (see
        #: publish_once)
        self._client_lock = threading.Lock()
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

    def connection_kwargs(self) -> tuple[str, dict[str, Any]]:
        """The URL and redis-py's keyword arguments of a client to one Redis (as CACHES said
        when the store was built)."""
        target = self._target
        if isinstance(target, ImproperlyConfigured):
            raise target
        location, kwargs = target
        return location, dict(kwargs)

    def _read_target(self) -> tuple[str, dict[str, Any]]:
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
        client = self._client
        if client is None:
            location, kwargs = self.connection_kwargs()
            kwargs["retry"] = no_retry(Retry)
            made = redis.Redis.from_url(location, **kwargs)
            _pack_in_c(made.connection_pool)
            client = publish_once(self, "_client", made, self._client_lock)
        return client

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

            location, kwargs = self.connection_kwargs()
            kwargs["retry"] = no_retry(AsyncRetry)
            # The live paths wait for a busy Redis (pages cut their own wait short, see arun),
            # and for a busy event loop: a saturated process reaches a new connection's
            # handshake late though Redis answered it at once. A refused connection still
            # fails at once; a Redis that cannot be reached, after LIVE_SOCKET_TIMEOUT.
            live_timeout = max(self.conf.LIVE_SOCKET_TIMEOUT, kwargs["socket_timeout"])
            kwargs["socket_timeout"] = live_timeout
            kwargs["socket_connect_timeout"] = max(live_timeout, kwargs["socket_connect_timeout"])
            # Many connections of one process write at once: past the pool's size, wait for a
            # connection instead of failing ("Too many connections" would look like an outage).
            pool = CheckedConnectionPool.from_url(
                location,
                max_connections=kwargs.pop("max_connections", 100),
                timeout=live_timeout,
                **kwargs,
            )
            _pack_in_c(pool)
            client = redis.asyncio.Redis(connection_pool=pool)
            self._async_clients[loop] = client
        return client

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        if self.cluster is not None:
            await self.cluster.aclose()
        loop = asyncio.get_running_loop()
        client = self._async_clients.pop(loop, None)
        if client is not None:
            await client.aclose()
