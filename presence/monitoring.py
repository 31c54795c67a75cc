"""What operators and their tools ask a process: ``GET presence/api/health`` (:func:`health_view`)
and the Prometheus metrics (:func:`metrics_view`, a view the site routes itself, behind its own
guard). Neither touches the database (docs/operations.md)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import redis
from channels.layers import get_channel_layer
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.cache import add_never_cache_headers
from django.utils.translation import gettext as _
from django.views.decorators.csrf import csrf_exempt
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from presence import api, metrics, signals
from presence.conf import get_settings
from presence.hub import Hub
from presence.store import get_store, redact_url
from presence.store.connecting import stale_connection_retry

logger = logging.getLogger("presence")

OK = "ok"
#: the layer's state when the site has no channel layer (one process, announcements in memory)
NO_LAYER = "none"
#: longest wait for any one answer of a health check, seconds (SOCKET_TIMEOUT if shorter)
HEALTH_TIMEOUT = 1.0


def _timeout() -> float:
    return min(HEALTH_TIMEOUT, get_settings().SOCKET_TIMEOUT)


# --- one check at a time ---------------------------------------------------------------------

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _probes_executor() -> ThreadPoolExecutor:
    """The process's threads for health checks: two, so that a slow Redis does not hold the
    layer's check back (nor the other way round)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="presence-health")
        return _executor


class Probe:
    """A check run once at a time per process, in a thread of its own, whatever the event loop
    asking (a WSGI process runs each async view on a new one): requests that come while it runs
    share its answer. An anonymous flood of health requests costs one check at a time, on the
    connections the check keeps, not a new one per request."""

    def __init__(self, check: Callable[[], str]) -> None:
        self._check = check
        # Reentrant: a check that is done already runs its done-callback at once, in the thread
        # that adds it while holding this lock (a plain Lock deadlocked there).
        self._lock = threading.RLock()
        self._running: Future[str] | None = None

    async def state(self) -> str:
        with self._lock:
            running = self._running
            if running is None:
                running = self._running = _probes_executor().submit(self._check)
                running.add_done_callback(self._done)
        # Shielded: a request that gives up (timeout, disconnect) leaves the check to the others.
        return await asyncio.shield(asyncio.wrap_future(running))

    def _done(self, finished: Future[str]) -> None:
        with self._lock:
            if self._running is finished:
                self._running = None


# --- presence's Redis ------------------------------------------------------------------------


def _ping_redis() -> str:
    """PING presence's Redis (every master of a cluster) on the store's own clients, whose
    socket timeout is SOCKET_TIMEOUT. Blocking: run in a thread."""
    store = get_store()
    try:
        if store.cluster is None:
            store.client.ping()
        else:
            client = store.cluster.client
            for node in client.get_primaries():
                client.execute_command("PING", target_nodes=node)
    except Exception as error:  # whatever stops a PING is the answer
        logger.warning("Presence: health check: Redis did not answer PING (%s)", _why(error))
        return "timeout" if "imeout" in str(error) else "unavailable"
    return OK


_redis_probe = Probe(_ping_redis)


async def redis_state() -> str:
    return await _redis_probe.state()


# --- the channel layer -----------------------------------------------------------------------


def _layer_hosts(layer: Any) -> list[Any] | None:
    """The Redis servers of a channels_redis layer: ``hosts`` of the core layer, each shard's
    host of the pub/sub layer; None for another kind of layer."""
    hosts = getattr(layer, "hosts", None)
    if hosts is not None:
        return list(hosts)
    try:
        shards = layer._shards  # RedisPubSubChannelLayer, through this loop's layer
    except Exception:
        return None
    return [shard.host for shard in shards]


def _probe_client(host: dict[str, Any]) -> redis.Redis:
    """A client of one server of the layer (a channels_redis host: an ``address``, a Sentinel's
    ``master_name`` and ``sentinels``, or connection keywords) with one connection, kept."""
    host = dict(host)
    timeout = _timeout()
    options: dict[str, Any] = {
        **host,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "max_connections": 1,  # the probe's one check at a time
        "retry": stale_connection_retry(Retry),
    }
    if "address" in host:
        options.pop("address")
        return redis.Redis(
            connection_pool=redis.ConnectionPool.from_url(host["address"], **options)
        )
    master_name = options.pop("master_name", None)
    if master_name is not None:
        sentinel = Sentinel(
            options.pop("sentinels"), sentinel_kwargs=options.pop("sentinel_kwargs", None)
        )
        return redis.Redis(connection_pool=SentinelConnectionPool(master_name, sentinel, **options))
    return redis.Redis(connection_pool=redis.ConnectionPool(**options))


class LayerProbe(Probe):
    """PINGs each server of a channels_redis layer in turn, on one kept connection each."""

    def __init__(self, hosts: list[Any]) -> None:
        super().__init__(self._ping_all)
        self.hosts = hosts
        self._clients: list[redis.Redis] | None = None

    def _ping_all(self) -> str:
        try:
            if self._clients is None:
                self._clients = [_probe_client(host) for host in self.hosts]
            for client in self._clients:
                client.ping()
        except Exception as error:  # whatever stops a PING is the answer
            if "imeout" in str(error) or isinstance(error, redis.TimeoutError):
                logger.warning("Presence: health check: the channel layer did not answer in time")
                return "timeout"
            logger.warning("Presence: health check: the channel layer failed (%s)", _why(error))
            return "unavailable"
        return OK


#: the layer's probe, for the layer's servers it was made for (a changed CHANNEL_LAYERS: a new one)
_layer_probe: LayerProbe | None = None


def _layer_probe_for(hosts: list[Any]) -> LayerProbe:
    global _layer_probe
    probe = _layer_probe
    if probe is None or probe.hosts != hosts:
        probe = _layer_probe = LayerProbe(hosts)
    return probe


async def _round_trip(layer: Any) -> None:
    """Another kind of layer: a message sent to a new channel of this process, received."""
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "presence.health"})
    await layer.receive(channel)


async def layer_state() -> str:
    """PING each server of the channel layer (or, for another kind of layer, a round trip
    through it), within the health check's timeout."""
    layer = get_channel_layer()
    if layer is None:
        return NO_LAYER
    hosts = _layer_hosts(layer)
    try:
        async with asyncio.timeout(_timeout()):
            if hosts is not None:
                return await _layer_probe_for(hosts).state()
            await _round_trip(layer)
    except TimeoutError:
        logger.warning("Presence: health check: the channel layer did not answer in time")
        return "timeout"
    except Exception as error:
        logger.warning("Presence: health check: the channel layer failed (%s)", _why(error))
        return "unavailable"
    return OK


def _why(error: BaseException) -> str:
    return redact_url(str(error)) or type(error).__name__


def hub_lag() -> float | None:
    """How late the latest announcement reached this process's hub, seconds; None when no hub
    runs on this event loop (no WebSocket connection here, or a WSGI process)."""
    hub = Hub.current()
    if hub is None or hub.recovery.lag is None:
        return None
    return round(max(hub.recovery.lag, 0.0), 3)


# --- the views -------------------------------------------------------------------------------


def _method_not_allowed() -> JsonResponse:
    response = JsonResponse(
        {
            "error": {
                "code": "method_not_allowed",
                "message": _("Use %(methods)s.") % {"methods": "GET, HEAD"},
            }
        },
        status=405,
    )
    response["Allow"] = "GET, HEAD"
    return response


@csrf_exempt  # GET only; no session, no login
async def health_view(request: HttpRequest) -> HttpResponse:
    """200 ``{"redis": "ok", "layer": "ok", "lag": seconds | null}`` when presence's Redis and
    the channel layer answer; 503 with the failed part's state ("unavailable", "timeout").
    No login and no database; a PING per Redis server, both checks at once."""
    if request.method not in ("GET", "HEAD"):
        return _method_not_allowed()
    redis_now, layer_now = await asyncio.gather(redis_state(), layer_state())
    healthy = redis_now == OK and layer_now in (OK, NO_LAYER)
    response = JsonResponse(
        {"redis": redis_now, "layer": layer_now, "lag": hub_lag()},
        status=200 if healthy else 503,
    )
    add_never_cache_headers(response)
    return response


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics in Prometheus's text format. Route it yourself, behind a guard (staff only,
    or an allow-list of the scrapers' addresses): docs/operations.md. With
    ``PROMETHEUS_MULTIPROC_DIR`` set, the values of every process of the host are merged."""
    if not metrics.AVAILABLE:
        return JsonResponse(
            {
                "error": {
                    "code": "metrics_unavailable",
                    "message": _("Install django-live-presence[metrics] (prometheus_client)."),
                }
            },
            status=501,
        )
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        REGISTRY,
        CollectorRegistry,
        generate_latest,
    )

    registry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(metrics.ONLINE_COUNT)
    response = HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
    add_never_cache_headers(response)
    return response


# --- the sources of the site-wide metrics (presence.apps connects them) ---------------------


def _counting(name: str) -> Callable[..., None]:
    def receiver(**kwargs: Any) -> None:
        metrics.signal_sent(name)

    receiver.__name__ = f"count_{name}"
    return receiver


def connect() -> None:
    """Count presence's signals and read the users online from ``api.online_count``."""
    metrics.count_online_with(getattr(api, "online_count", None))
    for name in ("user_online", "user_offline"):
        signal = getattr(signals, name, None)
        if signal is not None:
            signal.connect(_counting(name), weak=False, dispatch_uid=f"presence.metrics.{name}")
