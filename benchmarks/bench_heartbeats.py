"""heartbeats: sustained heartbeat frames per second one consumer process handles with 2,000
open connections, and Redis round trips per heartbeat.

Each connection is a ``PresenceConsumer`` for its own user, driven directly through the ASGI
application in this process and event loop (no communicator queues): after the handshake, each
time the consumer asks for its next event it is handed another ``{"type":"heartbeat","state":
"active"}`` frame, so every connection always has one heartbeat being handled and the loop runs
flat out. A frame counts as handled when the consumer asks for the next event (Channels
dispatches one event at a time per connection). The rate limit is lifted (``RATE_LIMIT`` =
(10**9, 1)): clients sending one heartbeat every HEARTBEAT_INTERVAL never meet it, and this
measures capacity; so is the limit of openings at once (``OPENINGS_AT_ONCE`` = the connections:
they open without a subscription, and each would hold its place for ``OPENING_HOLD``). Every
heartbeat of a connection already recorded with the same device and state changes nothing
visible (``domain.live_news``), so none is announced.

A phase: all connections of a variant start; after a warm-up (2 s), frames handled, process CPU
time, Redis round trips (client side: one ``send_packed_command`` per pipeline), Redis commands
(``INFO commandstats``, commands inside the CONNECTION script included),
``lifecycle.aheartbeat`` calls that returned, and those the store did not record (it returned
None: see below) are counted for 4 s; round trips and commands are given per recorded heartbeat.
A heartbeat's store trips are those made within its own ``aheartbeat`` call (not those sent in
the window: the calls come in bursts, and a burst still in flight at the window's end would
count trips without their calls); the few trips that set up a connection the pool opens
(``HELLO``, ``CLIENT SETINFO``) are once per connection, not per heartbeat: counted apart. Then
the connections stop and every frame in flight is finished before the next phase. Variants
alternate phase by phase on the same loop (3 rounds, after one unmeasured phase each so that
every pool has opened its connections):

- ``ours``: as shipped.
- ``echo``: a bare ``AsyncWebsocketConsumer`` sending each frame back (no Redis, no database),
  as many connections, the same driver: the overhead ratio.

and, while the store's async pool is redis-py's default (a non-blocking ``ConnectionPool`` of at
most 100 connections that raises ``MaxConnectionsError`` beyond, which the store takes for a
Redis outage), ``ours + blocking pool``: the same consumers with the store's async client on a
``BlockingConnectionPool`` of 100 connections that waits for a free one (up to 20 s, redis-py's
default) instead: the suggested change.

- ``echo without the per-frame tidy``: the same echo without Channels' per-message
  ``aclose_old_connections`` (a ``sync_to_async(close_old_connections)`` round trip through the
  one thread-sensitive executor thread before each handler). Presence's consumer skips that hop
  too (it tidies once per second per process), so this is the fair baseline; the plain echo pays
  it on every frame.

"Not recorded" counts the ``aheartbeat`` calls that got the store's fallback (None) instead of
Redis's reply, each with its reason (:class:`Unrecorded`): ``pool wait``, every one of the
process's 100 pooled Redis connections stayed busy for the pool's whole wait
(``LIVE_SOCKET_TIMEOUT``, 5 s; back-pressure, no outage); ``outage``, the store declared Redis
unavailable; ``skipped``, Redis left alone for RETRY_INTERVAL after an outage. Pool waits are
expected on a saturated machine: the variants' phases come round every ~18 s, longer than the
consumer's throttle (a beat that changes nothing is written once per HEARTBEAT_INTERVAL / 2 =
15 s), so each phase of ours opens with all 2,000 connections due to write at once; a process
starved of CPU (load average 15-35 on 2 cores) gets through fewer than 2,000 writes in 5 s, and
the last ones in the queue give up. Such a beat is not lost: the consumer keeps its last write
time (and state) when a write is not recorded, so the connection's next beat writes (here at
once; in a browser HEARTBEAT_INTERVAL later, well within CONNECTION_TTL). The report follows
each such connection to its next write, after the counted phases too (unmeasured phases of ours
until every one made it, up to a minute): "left unwritten" (goal 0) counts those whose next
write failed too or never came, what would be a heartbeat lost. On a machine that is not
saturated nothing is left unrecorded at all (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.routing import URLRouter
from django.test.utils import override_settings
from django.urls import path

from benchmarks.bench_fanout import (
    TRIPS_OF_CALL,
    Tally,
    bounded,
    counting_warnings,
    instrumented,
    make_users,
    run_async,
    server_commands,
)
from benchmarks.common import Report, Sizes, flush, median, raw_client, say
from presence import lifecycle
from presence import store as store_module
from presence.routing import websocket_urlpatterns
from presence.store.client import is_pool_exhausted

NAME = "heartbeats"
BASE_ID = 21_000_000
HEARTBEAT = json.dumps({"type": "heartbeat", "state": "active"})
SHIPPED = "ours"
BLOCKING = "ours + blocking pool"
ECHO = "echo"
BARE_ECHO = "echo without the per-frame tidy"


#: why the store answered the heartbeat under way with its fallback (set during the call; the
#: shielded write runs in a task that copies this context, so shares the list)
WHY_NOT: ContextVar[list[str] | None] = ContextVar("presence_bench_why_not", default=None)
POOL_WAIT = "pool wait"
OUTAGE = "outage"
SKIPPED = "skipped"
LATE = "late"


@dataclass
class Unrecorded:
    """Heartbeats the store did not record, by reason, how long they waited, and what became of
    their connections."""

    reasons: Counter[str] = field(default_factory=Counter)
    #: seconds each unrecorded call took, from the handler's call to the store's fallback
    waits: list[float] = field(default_factory=list)
    #: connections with an unrecorded heartbeat while counted
    missed: set[str] = field(default_factory=set)
    #: of those, the ones whose next write has not returned yet
    awaiting: set[str] = field(default_factory=set)
    #: of those, the ones whose next write was not recorded either
    failed_again: set[str] = field(default_factory=set)

    def returned(self, connection: str, recorded: bool, counted: bool) -> None:
        """A write of ``connection`` returned (whether counted or not)."""
        if connection in self.awaiting:
            self.awaiting.discard(connection)
            if not recorded:
                self.failed_again.add(connection)
        if counted and not recorded:
            self.missed.add(connection)
            self.awaiting.add(connection)

    def still_unwritten(self) -> int:
        """Connections whose next write after an unrecorded one failed too, or never came."""
        return len(self.failed_again | self.awaiting)

    def describe(self) -> str:
        if not self.reasons:
            return "none"
        why = ", ".join(f"{reason} {n:,}" for reason, n in self.reasons.most_common())
        waits = sorted(self.waits)
        return (
            f"{why}; each waited {waits[0]:.1f}-{waits[-1]:.1f} s (median "
            f"{median(waits):.1f}); {len(self.missed):,} connections, of which "
            f"{len(self.failed_again):,} failed again at their next write and "
            f"{len(self.awaiting):,} made none"
        )


@contextmanager
def explaining_fallbacks() -> Iterator[None]:
    """Record in WHY_NOT why the store answered a call with its fallback."""
    store_cls = store_module.PresenceStore
    late, failed, arun = store_cls._late, store_cls._failed, store_cls.arun

    def note(reason: str) -> None:
        sink = WHY_NOT.get()
        if sink is not None:
            sink.append(reason)

    def explained_late(self: Any, plan: Any, error: Exception) -> Any:
        note(POOL_WAIT if is_pool_exhausted(error) else LATE)
        return late(self, plan, error)

    def explained_failed(self: Any, plan: Any, error: Exception) -> Any:
        note(OUTAGE)
        return failed(self, plan, error)

    async def explained_arun(self: Any, plan: Any, **kwargs: Any) -> Any:
        if plan.commands and not self.health.available():
            note(SKIPPED)
        return await arun(self, plan, **kwargs)

    store_cls._late = explained_late  # type: ignore[method-assign]
    store_cls._failed = explained_failed  # type: ignore[method-assign]
    store_cls.arun = explained_arun  # type: ignore[method-assign]
    try:
        yield
    finally:
        store_cls._late = late  # type: ignore[method-assign]
        store_cls._failed = failed  # type: ignore[method-assign]
        store_cls.arun = arun  # type: ignore[method-assign]


class EchoConsumer(AsyncWebsocketConsumer):
    """The baseline: accepts, and sends every text frame back. No channel layer either."""

    channel_layer_alias = "presence.hub-only"

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send(text_data=text_data)


class BareEchoConsumer(EchoConsumer):
    """The echo without Channels' per-message ``aclose_old_connections`` (presence's consumer
    skips it too, tidying once per second per process): the fair baseline."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)


class Group:
    """The connections of one consumer class and what they handled while counted."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.sockets: list[Socket] = []
        self.counting = False
        self.handled = 0
        self.in_flight = 0
        self.idle = asyncio.Event()

    def start(self) -> None:
        self.idle.clear()
        for socket in self.sockets:
            socket.go.set()

    async def stop(self) -> None:
        """Stop handing out frames; wait until every frame in flight is handled."""
        for socket in self.sockets:
            socket.go.clear()
        if self.in_flight:
            await asyncio.wait_for(self.idle.wait(), 300)


class Socket:
    """One WebSocket connection driven through the ASGI application."""

    def __init__(self, app: Any, user: Any, group: Group) -> None:
        self.group = group
        self.started = False
        self.in_flight = False
        self.closing = False
        self.ready = asyncio.Event()
        #: set while the connection is to send heartbeats (or to close)
        self.go = asyncio.Event()
        scope = {
            "type": "websocket",
            "path": "/ws/presence/",
            "query_string": b"",
            "headers": [(b"user-agent", b"Mozilla/5.0 (X11; Linux x86_64)")],
            "subprotocols": [],
            "user": user,
        }
        self.task = asyncio.ensure_future(app(scope, self.receive, self.send))

    async def receive(self) -> dict[str, Any]:
        if not self.started:
            self.started = True
            return {"type": "websocket.connect"}
        # Channels asks for the next event only once the previous one is handled.
        self.ready.set()
        group = self.group
        if self.in_flight:
            self.in_flight = False
            group.in_flight -= 1
            if group.counting:
                group.handled += 1
            if not group.in_flight:
                group.idle.set()
        await self.go.wait()
        if self.closing:
            return {"type": "websocket.disconnect", "code": 1000}
        self.in_flight = True
        group.in_flight += 1
        return {"type": "websocket.receive", "text": HEARTBEAT}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "websocket.close":
            raise RuntimeError(f"{self.group.label}: the consumer closed the connection")

    async def open(self) -> None:
        await asyncio.wait_for(self.ready.wait(), 120)

    async def close(self) -> None:
        self.closing = True
        self.go.set()
        await asyncio.wait_for(self.task, 120)


@dataclass
class Phase:
    seconds: float
    frames: int
    cpu: float
    other_trips: int = 0
    store_trips: int = 0
    set_up_trips: int = 0
    commands: int = 0
    not_recorded: int = 0
    #: lifecycle.aheartbeat calls that returned while counted (a round trip is counted when sent,
    #: a few milliseconds before: counting calls as they start would include the frames
    #: queued for Channels' per-frame thread hop)
    calls: int = 0
    store_failures: int = 0
    redis_clients: int = 0

    @property
    def rate(self) -> float:
        return self.frames / self.seconds


@dataclass
class Variant:
    label: str
    group: Group
    #: the store's async client while this variant runs (None: not a presence variant)
    client: Any = None
    phases: list[Phase] = field(default_factory=list)

    def total(self, attribute: str) -> int:
        return sum(getattr(p, attribute) for p in self.phases)

    def frames(self) -> int:
        return max(1, self.total("frames"))

    def rate(self) -> float:
        return median(p.rate for p in self.phases)

    def cpu_per_frame(self) -> float:
        return sum(p.cpu for p in self.phases) / self.frames()

    def per_frame(self, attribute: str) -> float:
        return self.total(attribute) / self.frames()

    def per_call(self, attribute: str) -> float:
        """Per heartbeat (lifecycle.aheartbeat call) that returned while counted."""
        return self.total(attribute) / max(1, self.total("calls"))

    def per_recorded(self, attribute: str) -> float:
        """Per heartbeat recorded in Redis while counted."""
        return self.total(attribute) / max(1, self.total("calls") - self.total("not_recorded"))

    def not_recorded(self) -> str:
        n = self.total("not_recorded")
        return f"{n:,} of {self.frames():,} ({n / self.frames():.0%})"


def blocking_client(store: store_module.PresenceStore) -> redis.asyncio.Redis:
    """The store's async client as it would be with the suggested change: the same connection
    settings on a BlockingConnectionPool of 100 connections (wait for a free one instead of
    failing)."""
    from redis.asyncio.retry import Retry as AsyncRetry
    from redis.backoff import NoBackoff

    location, kwargs = store._connections.connection_kwargs()
    kwargs["retry"] = AsyncRetry(NoBackoff(), 0)
    kwargs.setdefault("max_connections", 100)
    pool = redis.asyncio.BlockingConnectionPool.from_url(location, timeout=20, **kwargs)
    return redis.asyncio.Redis(connection_pool=pool)


def redis_clients(client: redis.Redis) -> int:
    info: dict[str, Any] = client.info("clients")
    return int(info["connected_clients"])


class Bench:
    def __init__(self, tally: Tally, stats: redis.Redis) -> None:
        self.tally = tally
        self.stats = stats
        self.results: Counter[str] = Counter()
        #: the variant whose phase runs, and each variant's unrecorded heartbeats
        self.current = SHIPPED
        self.unrecorded: dict[str, Unrecorded] = {}

    async def phase(self, variant: Variant, seconds: float, warm: float, record: bool) -> None:
        store = store_module.get_store()
        if variant.client is not None:
            store._connections._async_clients[asyncio.get_running_loop()] = variant.client
            # Each phase starts healthy (an outage declared in the previous phase lasts
            # RETRY_INTERVAL and would skip Redis here).
            store.health.down_until = 0.0
            store.health.in_outage = False
        group, tally = variant.group, self.tally
        self.current = variant.label
        self.unrecorded.setdefault(variant.label, Unrecorded())
        group.start()
        await asyncio.sleep(warm)
        before = server_commands(self.stats)
        self.results.clear()
        tally.reset()
        group.handled = 0
        clients = 0
        started, cpu = time.perf_counter(), time.process_time()
        tally.active = group.counting = True
        while time.perf_counter() - started < seconds:
            await asyncio.sleep(min(0.5, seconds / 2))
            if variant.client is not None:
                # One INFO from this thread (blocks the loop well under a millisecond).
                tally.active = False
                clients = max(clients, redis_clients(self.stats))
                tally.active = True
        frames = group.handled
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        tally.active = group.counting = False
        commands = sum((server_commands(self.stats) - before).values())
        await group.stop()
        phase = Phase(elapsed, frames, cpu, redis_clients=clients, commands=commands)
        # Everything else sent while counted: the channel layer's trips and the sweeps.
        phase.other_trips = tally.round_trips(skip_sweep=False) - tally.round_trips("store")
        # Each call's own trips: counting the trips sent in the window against the calls that
        # returned in it would count a burst of heartbeats still in flight at its end. A
        # connection the pool opens costs a few set-up trips once (HELLO, CLIENT SETINFO): not
        # a heartbeat's; counted apart.
        phase.store_trips = self.results["trips of calls"]
        phase.set_up_trips = tally.set_up_trips["store"]
        phase.store_failures = tally.store_failures
        phase.not_recorded = self.results["not recorded"]
        phase.calls = self.results["calls"]
        if record:
            variant.phases.append(phase)
        await asyncio.sleep(0.2)


async def main(
    report: Report, users: list[Any], connections: int, rounds: int, seconds: float, warm: float
) -> None:
    stats = raw_client(decode=True)
    store = store_module.get_store()
    ours_app = URLRouter(websocket_urlpatterns)
    echo_app = URLRouter([path("ws/presence/", EchoConsumer.as_asgi())])
    bare_app = URLRouter([path("ws/presence/", BareEchoConsumer.as_asgi())])
    presence_group, echo_group, bare_group = Group("ours"), Group(ECHO), Group(BARE_ECHO)
    variants = [Variant(SHIPPED, presence_group, client=store.async_client)]
    if not isinstance(store.async_client.connection_pool, redis.asyncio.BlockingConnectionPool):
        variants.append(Variant(BLOCKING, presence_group, client=blocking_client(store)))
    variants.append(Variant(ECHO, echo_group))
    variants.append(Variant(BARE_ECHO, bare_group))

    with instrumented() as tally, counting_warnings() as warnings, explaining_fallbacks():
        bench = Bench(tally, stats)
        heartbeat = lifecycle.aheartbeat

        async def counting_heartbeat(user: Any, connection_id: str, *args: Any) -> Any:
            trips, why = [0], list[str]()
            token, why_token = TRIPS_OF_CALL.set(trips), WHY_NOT.set(why)
            started = time.perf_counter()
            try:
                transition = await heartbeat(user, connection_id, *args)
            finally:
                WHY_NOT.reset(why_token)
                TRIPS_OF_CALL.reset(token)
            unrecorded = bench.unrecorded[bench.current]
            unrecorded.returned(connection_id, transition is not None, tally.active)
            if tally.active:
                bench.results["calls"] += 1
                bench.results["trips of calls"] += trips[0]
                if transition is None:
                    bench.results["not recorded"] += 1
                    unrecorded.reasons[why[0] if why else "unexplained"] += 1
                    unrecorded.waits.append(time.perf_counter() - started)
            return transition

        started = time.perf_counter()
        for group, app in (
            (presence_group, ours_app),
            (echo_group, echo_app),
            (bare_group, bare_app),
        ):
            group.sockets = [Socket(app, user, group) for user in users]
            await bounded([s.open for s in group.sockets], 10)
        say(
            f"  {2 * connections:,} connections opened ({connections:,} per consumer class) in "
            f"{time.perf_counter() - started:.1f} s (not measured); then {rounds} rounds of "
            f"{warm:g} + {seconds:g} s (warm-up + counted) per variant"
        )
        # Every pool opens its connections now: their handshakes (HELLO, CLIENT SETINFO) are
        # not a heartbeat's cost. Most heartbeats write nothing (one write per connection per
        # half interval), so a handshake inside a counted phase would weigh on the few that do.
        for variant in variants:
            if variant.client is not None:
                await asyncio.gather(*(variant.client.ping() for _ in range(400)))
        lifecycle.aheartbeat = counting_heartbeat  # type: ignore[assignment]
        started = time.perf_counter()
        try:
            # One unmeasured phase each first: every pool opens its connections.
            for variant in variants if warm >= 1 else ():
                await bench.phase(variant, seconds / 2, 0, record=False)
            for _ in range(rounds):
                for variant in variants:
                    await bench.phase(variant, seconds, warm, record=True)
            # A connection whose heartbeat went unrecorded writes at its next one: more
            # (unmeasured) phases of ours hand each its next heartbeat (up to a minute), so
            # "left unwritten" counts only connections whose next write failed too.
            settling = time.perf_counter()
            while bench.unrecorded[SHIPPED].awaiting and time.perf_counter() - settling < 60:
                await bench.phase(variants[0], max(1.0, seconds / 2), 0, record=False)
        finally:
            lifecycle.aheartbeat = heartbeat  # type: ignore[assignment]
            store._connections._async_clients[asyncio.get_running_loop()] = variants[0].client
            store.health.down_until = 0.0
            say(f"  phases took {time.perf_counter() - started:.0f} s")
            started = time.perf_counter()
            for group in (presence_group, echo_group, bare_group):
                await bounded([s.close for s in group.sockets], 20)
            say(f"  closed in {time.perf_counter() - started:.1f} s (not measured)")

    for variant in variants:
        line = (
            f"  {variant.label:<26} {variant.rate():>7,.0f} frames/s (median of "
            + ", ".join(f"{p.rate:,.0f}" for p in variant.phases)
            + f"); {variant.cpu_per_frame() * 1e6:,.0f} µs CPU per frame"
        )
        if variant.client is not None:
            line += (
                f"; per recorded heartbeat {variant.per_recorded('store_trips'):.2f} store"
                f" + {variant.per_recorded('other_trips'):.3f} other Redis round trips"
                f", {variant.per_recorded('commands'):.2f} commands"
                f"; not recorded {variant.not_recorded()}"
                f" ({bench.unrecorded[variant.label].describe()})"
                f"; store outages declared {variant.total('store_failures')}"
                f"; Redis clients up to {max(p.redis_clients for p in variant.phases)}"
            )
        say(line)
    if warnings.total():
        warnings.show()

    shipped, echo, bare = variants[0], variants[-2], variants[-1]
    recorded = shipped.frames() - shipped.total("not_recorded")
    report.add(NAME, "connections per consumer process", f"{connections:,}")
    share = recorded / shipped.frames()
    report.add(
        NAME,
        "ours: heartbeats handled/s (of which recorded)",
        f"{shipped.rate():,.0f} ({shipped.rate() * share:,.0f})",
    )
    report.add(
        NAME,
        "ours: heartbeats not recorded in Redis (of frames handled)",
        f"{shipped.not_recorded()}; {shipped.total('store_failures')} outages declared",
        "0",
        recorded == shipped.frames(),
    )
    missed = bench.unrecorded[SHIPPED]
    report.add(
        NAME,
        "ours: why not recorded (pool wait: back-pressure, LIVE_SOCKET_TIMEOUT)",
        missed.describe(),
    )
    report.add(
        NAME,
        "ours: connections left unwritten (their next write failed too, or never came)",
        f"{missed.still_unwritten():,}",
        "0",
        missed.still_unwritten() == 0,
    )
    trips = shipped.per_recorded("store_trips")
    report.add(
        NAME,
        "ours: Redis round trips per recorded heartbeat",
        f"{trips:.2f} store (+{shipped.per_call('other_trips'):.3f} channel layer and sweeps"
        f" per heartbeat; {shipped.total('set_up_trips')} to set up new store connections)",
        "1",
        round(trips, 2) <= 1.0,
    )
    report.add(
        NAME,
        "ours: Redis commands per recorded heartbeat",
        f"{shipped.per_recorded('commands'):.2f}",
    )
    report.add(NAME, "echo: frames handled/s", f"{echo.rate():,.0f}")
    report.add(NAME, "echo without the per-frame tidy: frames handled/s", f"{bare.rate():,.0f}")
    report.add(
        NAME,
        "ours/echo frames/s (the echo without the per-frame tidy; with it)",
        f"{shipped.rate() / bare.rate():.2f} ({shipped.rate() / echo.rate():.2f})",
        "≥ 0.6",
        shipped.rate() / bare.rate() >= 0.6,
    )
    report.add(
        NAME,
        "ours/echo CPU per frame (the echo without the per-frame tidy)",
        f"{shipped.cpu_per_frame() / bare.cpu_per_frame():.1f}x",
    )
    for variant in variants[1:-2]:
        report.add(
            NAME,
            f"{variant.label}: heartbeats/s; not recorded",
            f"{variant.rate():,.0f}; {variant.not_recorded()}",
        )
        report.add(
            NAME,
            f"{variant.label}: round trips/recorded; echo/it frames/s, it/echo CPU",
            f"{variant.per_recorded('store_trips'):.2f}; {echo.rate() / variant.rate():.1f}x, "
            f"{variant.cpu_per_frame() / echo.cpu_per_frame():.1f}x",
        )
    if len(variants) > 3:
        await variants[1].client.aclose()
    await store.aclose()
    flush(stats)
    stats.close()


def run(sizes: Sizes, report: Report) -> None:
    connections = 50 if report.quick else 2000
    rounds, seconds, warm = (1, 0.5, 0.2) if report.quick else (3, 4.0, 2.0)
    say(f"\n== heartbeats: {connections:,} open connections on one consumer process ==")
    flush(raw_client())
    users = make_users(BASE_ID, connections, "beat")
    # Its sockets open without a subscription, so each would hold its place among the openings
    # for OPENING_HOLD (2,000 of them 24 at a time: past the 120 s an opening is waited for).
    # What the openings cost is admission_flood's and page_views'; here they all open at once.
    limits = {"RATE_LIMIT": (10**9, 1), "OPENINGS_AT_ONCE": connections}
    with override_settings(PRESENCE=limits):
        run_async(main(report, users, connections, rounds, seconds, warm))
