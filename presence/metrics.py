"""Presence's Prometheus metrics, each defined once here (docs/operations.md lists them).

With ``prometheus_client`` installed (the ``metrics`` extra) they are registered in its default
registry, so any exporter of it shows them: django-prometheus's ``/metrics``, or
:func:`presence.monitoring.metrics_view`. Without it every metric is a no-op object whose calls
do nothing, so the hooks in the hot paths (frames, sends, the hub's delivery, the store) cost a
function call and no more.

The hooks are one call each, on module attributes (``metrics.FRAMES_SENT``...), so that
:func:`switch` (benchmarks, tests) turns them all off and on again in one place. Label values
are presence's own names (frame types, Redis nodes), never client input: a bounded set.

This module imports nothing of presence: every layer may call it.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

try:
    import prometheus_client
    from prometheus_client.core import GaugeMetricFamily
except ImportError:  # the extra is not installed: every metric is a no-op
    prometheus_client = None  # type: ignore[assignment]

#: whether prometheus_client is installed
AVAILABLE = prometheus_client is not None

#: fan-out latency buckets, seconds: the coalescing window (0.2 s) and a bit are the usual case
FANOUT_BUCKETS = (0.05, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
#: Redis round-trip buckets, seconds: a pipeline is about 0.1-1 ms; SOCKET_TIMEOUT is 0.5 s
REDIS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class _Off:
    """A metric that records nothing: what every metric is without prometheus_client, or after
    ``switch(False)``."""

    def labels(self, *values: str) -> _Off:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def dec(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


OFF = _Off()


def _define() -> dict[str, Any]:
    """Every metric, registered once in prometheus_client's default registry."""
    if prometheus_client is None:
        return {}
    from prometheus_client import Counter, Gauge, Histogram

    # Gauges of one process: in multiprocess mode each live process's value is kept, with
    # a pid label ("liveall"); otherwise each process is its own scrape target.
    return {
        "CONNECTIONS": Gauge(
            "presence_connections",
            "Open WebSocket connections of this process.",
            multiprocess_mode="liveall",
        ),
        "WATCHED_USERS": Gauge(
            "presence_watched_users",
            "Distinct users this process's connections subscribe to.",
            multiprocess_mode="liveall",
        ),
        "FRAMES_RECEIVED": Counter(
            "presence_frames_received",
            "WebSocket frames handled, by type (frames refused before they had a valid type "
            "are not counted: their error answers are, in presence_frames_sent).",
            ["type"],
        ),
        "FRAMES_SENT": Counter(
            "presence_frames_sent",
            "WebSocket frames sent, by type (presence_diff, presence_state, room frames, error).",
            ["type"],
        ),
        "FANOUT_SECONDS": Histogram(
            "presence_fanout_latency_seconds",
            "From a change's start (or its arrival here, when later than one coalescing window) "
            "until this process handed its diffs to the sockets; per changed user.",
            buckets=FANOUT_BUCKETS,
        ),
        "DELIVERIES": Counter(
            "presence_deliveries",
            "Changed users resolved and delivered to this process's watchers.",
        ),
        "COALESCED": Counter(
            "presence_coalesced_changes",
            "Changes merged into a delivery already waiting for its coalescing window "
            "(deliveries saved).",
        ),
        "REDIS_ROUND_TRIPS": Counter(
            "presence_redis_round_trips",
            "Pipelines sent to presence's Redis, by node ('redis', or a cluster master).",
            ["node"],
        ),
        "REDIS_SECONDS": Histogram(
            "presence_redis_latency_seconds",
            "Time of a pipeline's round trip to presence's Redis, by node.",
            ["node"],
            buckets=REDIS_BUCKETS,
        ),
        "REDIS_OUTAGES": Counter(
            "presence_redis_outages",
            "Outages of presence's Redis that began, by node.",
            ["node"],
        ),
        "REDIS_UP": Gauge(
            "presence_redis_up",
            "1 while presence's Redis (by node) answers this process, 0 during an outage.",
            ["node"],
            multiprocess_mode="liveall",
        ),
        "LAYER_FAILURES": Counter(
            "presence_channel_layer_failures",
            "Channel-layer calls of this process that failed (send, group add or leave, receive).",
        ),
        "HUB_LAG": Gauge(
            "presence_hub_lag_seconds",
            "How late the latest announcement reached this process's hub (sent to received).",
            multiprocess_mode="liveall",
        ),
        "SIGNALS_SENT": Counter(
            "presence_signals_sent",
            "user_online and user_offline signals this process sent.",
            ["signal"],
        ),
    }


_REAL = _define()

CONNECTIONS: Any = OFF
WATCHED_USERS: Any = OFF
FRAMES_RECEIVED: Any = OFF
FRAMES_SENT: Any = OFF
FANOUT_SECONDS: Any = OFF
DELIVERIES: Any = OFF
COALESCED: Any = OFF
REDIS_ROUND_TRIPS: Any = OFF
REDIS_SECONDS: Any = OFF
REDIS_OUTAGES: Any = OFF
REDIS_UP: Any = OFF
LAYER_FAILURES: Any = OFF
HUB_LAG: Any = OFF
SIGNALS_SENT: Any = OFF

#: labelled children, looked up once per label value (prometheus_client's own lookup takes a
#: lock and builds a tuple each time)
_children: dict[tuple[str, Any], Any] = {}
_enabled = False


def switch(on: bool) -> None:
    """Record (``True``, the default when prometheus_client is installed) or not. What was
    recorded stays; benchmarks compare the hot paths with and without metrics this way."""
    global _enabled
    if _REAL:
        flush()
    _enabled = on and AVAILABLE
    for name in _REAL:
        globals()[name] = _REAL[name] if _enabled else OFF
    _children.clear()


def enabled() -> bool:
    return _enabled


def _child(metric: str, key: Any, label: Callable[[Any], str] = str) -> Any:
    child = _children.get((metric, key))
    if child is None:
        child = _children[(metric, key)] = globals()[metric].labels(label(key))
    return child


_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def _frame_name(kind: Any) -> str:
    """A parsed frame's type as the protocol spells it: ``SetStatus`` -> ``set_status``."""
    return kind if isinstance(kind, str) else _CAMEL.sub("_", kind.__name__).lower()


# --- the hooks, one call each where it happens ---------------------------------------------


class _Tally:
    """Counts of one labelled counter kept in a plain dict on the event loop's thread and added
    to the counter once per :data:`FLUSH_SECONDS` (by a callback on that loop): a heartbeat
    costs a dict update, not the counter's lock (a throttled heartbeat is ~30 µs of CPU)."""

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self.counts: dict[Any, int] = {}
        #: the loop a flush is scheduled on (None: none scheduled)
        self.loop: asyncio.AbstractEventLoop | None = None

    def add(self, key: Any) -> None:
        counts = self.counts
        counts[key] = counts.get(key, 0) + 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop here: at once
            self.flush()
            return
        if loop is not self.loop:
            self.loop = loop
            loop.call_later(FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        """Add what was counted to the counter (tests call it to read at once)."""
        self.loop = None
        counts, self.counts = self.counts, {}
        for key, count in counts.items():
            _child(self.metric, key, _frame_name).inc(count)


#: how long counts of frames may wait before they reach their counter, seconds
FLUSH_SECONDS = 1.0
FRAMES_IN = _Tally("FRAMES_RECEIVED")
FRAMES_OUT = _Tally("FRAMES_SENT")


def frame_received(message: object) -> None:
    """A client frame parsed into ``message`` (a frame type of an installed app: its type)."""
    if _enabled:
        FRAMES_IN.add(getattr(message, "type", None) or type(message))


def frame_sent(kind: str) -> None:
    if _enabled:
        FRAMES_OUT.add(kind)


def flush() -> None:
    """Every count still waiting for its counter, added now (tests, benchmarks)."""
    FRAMES_IN.flush()
    FRAMES_OUT.flush()


def delivered(window_ends: Iterable[float], now: float, window: float) -> None:
    """Users delivered at loop time ``now`` whose coalescing windows ended at ``window_ends``
    (a window starts when the change did): the fan-out latency of each."""
    if _enabled:
        observe = FANOUT_SECONDS.observe
        count = 0
        for end in window_ends:
            observe(now - end + window)
            count += 1
        DELIVERIES.inc(count)


def redis_round_trip(node: str, seconds: float) -> None:
    if _enabled:
        _child("REDIS_ROUND_TRIPS", node).inc()
        _child("REDIS_SECONDS", node).observe(seconds)


def redis_outage(node: str) -> None:
    """An outage of ``node`` began (the store's failure policy declared it)."""
    if _enabled:
        _child("REDIS_OUTAGES", node).inc()
        _child("REDIS_UP", node).set(0)


def redis_answered(node: str) -> None:
    """``node`` answered after an outage (or for the first time)."""
    if _enabled:
        _child("REDIS_UP", node).set(1)


def signal_sent(name: str) -> None:
    if _enabled:
        _child("SIGNALS_SENT", name).inc()


# --- users online: a site-wide value read when scraped -------------------------------------


class _OnlineCount:
    """``presence_users_online``: calls the count (presence.api.online_count, a bounded number
    of Redis commands) at each scrape. The same on every process: site-wide, no per-process
    state, so it needs no multiprocess mode."""

    def __init__(self) -> None:
        self.count: Callable[[], int] | None = None
        self._lock = threading.Lock()

    def describe(self) -> Iterator[Any]:
        return iter(())  # unchecked: the value is read only when scraped

    def collect(self) -> Iterator[Any]:
        count = self.count
        if count is None or not _enabled:
            return
        try:
            value = count()
        except Exception:  # Redis in an outage: no sample this scrape, rather than an error
            return
        yield GaugeMetricFamily(
            "presence_users_online",
            "Users online now on the whole site (invisible users left out).",
            value=value,
        )


ONLINE_COUNT = _OnlineCount()


def count_online_with(count: Callable[[], int] | None) -> None:
    """Read ``presence_users_online`` from ``count`` (presence.apps connects online_count);
    None: no such metric."""
    ONLINE_COUNT.count = count


if prometheus_client is not None:
    prometheus_client.REGISTRY.register(ONLINE_COUNT)

switch(True)
