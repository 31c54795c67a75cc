"""heartbeats: sustained heartbeat frames per second one consumer process handles with 2,000
open connections, how many of them it writes to Redis, and what a written heartbeat costs.

Each connection is a ``PresenceConsumer`` for its own user, driven directly through the ASGI
application in this process and event loop (no communicator queues): after the handshake, each
time the consumer asks for its next event it is handed another ``{"type":"heartbeat","state":
"active"}`` frame, so every connection always has one heartbeat being handled and the loop runs
flat out. A frame counts as handled when the consumer asks for the next event (Channels
dispatches one event at a time per connection). The rate limit is lifted (``RATE_LIMIT`` =
(10**9, 1)): clients sending one heartbeat every HEARTBEAT_INTERVAL never meet it, and this
measures capacity; so is the limit of openings at once (``OPENINGS_AT_ONCE`` = the presence
connections: they open without a subscription, and each would hold its place for
``OPENING_HOLD``). Every heartbeat of a connection already recorded with the same device and
state changes nothing visible (``domain.live_news``), so none is announced.

Most of ``ours``' frames are throttled: a beat that changes nothing within HEARTBEAT_INTERVAL / 2
(15 s) of the connection's last write is not written (presence.consumers.handlers ``beat``). The
variants' phases come round every ~27 s, so each phase of ours opens with its 2,000 connections
due: they write once, in the first moments of the phase (its warm-up), and every later frame of
the phase is throttled. Its frames/s is therefore the rate of throttled beats; what a written
beat costs is measured by ``ours, every beat written`` below.

A phase: all connections of a variant start; after a warm-up (2 s), frames handled, process CPU
time and Redis round trips (client side: one ``send_packed_command`` per pipeline) are counted
for 4 s (the counted window). Heartbeat writes are counted over the whole phase, warm-up and the
frames finished after the window included: the ``lifecycle.aheartbeat`` calls that returned
(writes attempted), those the store did not record (it returned None: see below), the store
round trips sent within each call, and Redis commands (``INFO commandstats`` before and after
the phase, commands inside the CONNECTION script and the phase's sweeps included); round trips
and commands are given per written (recorded) heartbeat, "not recorded" of the writes attempted.
A call's trips are measured inside the call, so where a burst of writes falls in the phase does
not matter; live writes of one loop moment share one pipeline (presence.store.client
``_Batches``), counted in the call that started it, so a burst of 2,000 writes costs a handful
of round trips. The few trips that set up a connection the pool opens (``HELLO``, ``CLIENT
SETINFO``) are once per connection, not per heartbeat: counted apart. A goal that nothing was
measured against (no heartbeat written, no write attempted) is missed, not met. Then the
connections stop and every frame in flight is finished before the next phase. Variants alternate
phase by phase on the same loop (3 rounds, after one unmeasured phase each so that every pool
has opened its connections):

- ``ours``: as shipped.
- ``ours, every beat written``: presence's consumer with each connection's heartbeat interval
  set to 0 once open (a setting of the connection's state, not of the product), so the throttle
  never skips and every frame is a write (of nothing visible: none is announced); 2,000 more
  connections, of users of their own. Its written heartbeats/s and process CPU per written
  heartbeat (Redis runs in its own process) are counted in the window.
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
expected on a saturated machine: the variants' phases come round every ~27 s, longer than the
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
from presence.consumers import PresenceConsumer
from presence.routing import websocket_urlpatterns
from presence.store.client import is_pool_exhausted

NAME = "heartbeats"
BASE_ID = 21_000_000
WRITERS_BASE_ID = 21_500_000
HEARTBEAT = json.dumps({"type": "heartbeat", "state": "active"})
SHIPPED = "ours"
BLOCKING = "ours + blocking pool"
WRITTEN = "ours, every beat written"
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
    #: connections with an unrecorded heartbeat in a phase
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


class EveryBeatWritten(PresenceConsumer):
    """Presence's consumer with its connection's heartbeat interval 0 once open: the throttle
    (a beat that changes nothing is written once per half interval) never skips, so every
    frame is a write. The beats change nothing visible, so none is announced."""

    async def connect(self) -> None:
        await super().connect()
        if self.attached:
            self.state.heartbeat_interval = 0.0


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
    #: the counted window: its length, frames handled and process CPU time in it
    seconds: float
    frames: int
    cpu: float
    #: the whole phase, warm-up and the frames in flight at its end included
    span: float = 0.0
    other_trips: int = 0
    set_up_trips: int = 0
    store_failures: int = 0
    redis_clients: int = 0
    #: over the whole phase: lifecycle.aheartbeat calls (writes attempted), their own store
    #: round trips, those the store did not record, and Redis commands (INFO commandstats)
    calls: int = 0
    store_trips: int = 0
    not_recorded: int = 0
    commands: int = 0
    #: lifecycle.aheartbeat calls that returned in the counted window, and those not recorded
    window_calls: int = 0
    window_not_recorded: int = 0

    @property
    def rate(self) -> float:
        return self.frames / self.seconds

    @property
    def written(self) -> int:
        return self.calls - self.not_recorded

    @property
    def window_written(self) -> int:
        return self.window_calls - self.window_not_recorded


@dataclass
class Variant:
    label: str
    group: Group
    #: the store's async client while this variant runs (None: not a presence variant)
    client: Any = None
    phases: list[Phase] = field(default_factory=list)

    def total(self, attribute: str) -> int:
        return sum(getattr(p, attribute) for p in self.phases)

    def rate(self) -> float:
        return median(p.rate for p in self.phases)

    def cpu_per_frame(self) -> float:
        return sum(p.cpu for p in self.phases) / max(1, self.total("frames"))

    def written(self) -> int:
        """Heartbeats recorded in Redis over the phases (warm-up included)."""
        return self.total("written")

    def per_written(self, attribute: str) -> float | None:
        """Per heartbeat recorded in Redis over the phases; None when none was."""
        written = self.written()
        return self.total(attribute) / written if written else None

    def written_rate(self) -> float:
        """Heartbeats recorded per second in the counted windows (median of the phases)."""
        return median(p.window_written / p.seconds for p in self.phases)

    def written_per_second_of_phase(self) -> float:
        return self.written() / max(1e-9, self.total("span"))

    def cpu_per_written(self) -> float | None:
        written = self.total("window_written")
        return sum(p.cpu for p in self.phases) / written if written else None

    def not_recorded(self) -> str:
        n, attempted = self.total("not_recorded"), self.total("calls")
        if not attempted:
            return "nothing measured: no write attempted"
        return f"{n:,} of {attempted:,} writes attempted ({n / attempted:.0%})"


def figure(value: float | None, spec: str) -> str:
    return "n/a (none written)" if value is None else format(value, spec)


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
        #: heartbeats are counted over the whole phase (``phase_on``; a call's trips are
        #: measured inside the call, so where a burst of writes falls does not matter), and
        #: apart in the counted window (``window_on``) for the written rate
        self.phase_on = False
        self.window_on = False

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
        self.results.clear()
        phase_commands = server_commands(self.stats)
        phase_started = time.perf_counter()
        self.phase_on = True
        group.start()
        await asyncio.sleep(warm)
        tally.reset()
        group.handled = 0
        clients = 0
        started, cpu = time.perf_counter(), time.process_time()
        tally.active = group.counting = self.window_on = True
        while time.perf_counter() - started < seconds:
            await asyncio.sleep(min(0.5, seconds / 2))
            if variant.client is not None:
                # One INFO from this thread (blocks the loop well under a millisecond).
                tally.active = False
                clients = max(clients, redis_clients(self.stats))
                tally.active = True
        frames = group.handled
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        tally.active = group.counting = self.window_on = False
        await group.stop()
        self.phase_on = False
        span = time.perf_counter() - phase_started
        commands = sum((server_commands(self.stats) - phase_commands).values())
        phase = Phase(elapsed, frames, cpu, span=span, redis_clients=clients, commands=commands)
        # Everything else sent in the window: the channel layer's trips and the sweeps.
        phase.other_trips = tally.round_trips(skip_sweep=False) - tally.round_trips("store")
        # A connection the pool opens costs a few set-up trips once (HELLO, CLIENT SETINFO):
        # not a heartbeat's; counted apart.
        phase.set_up_trips = tally.set_up_trips["store"]
        phase.store_failures = tally.store_failures
        phase.calls = self.results["calls"]
        phase.store_trips = self.results["trips of calls"]
        phase.not_recorded = self.results["not recorded"]
        phase.window_calls = self.results["window calls"]
        phase.window_not_recorded = self.results["window not recorded"]
        if record:
            variant.phases.append(phase)
        await asyncio.sleep(0.2)


async def main(
    report: Report,
    users: list[Any],
    writers: list[Any],
    connections: int,
    rounds: int,
    seconds: float,
    warm: float,
) -> None:
    stats = raw_client(decode=True)
    store = store_module.get_store()
    ours_app = URLRouter(websocket_urlpatterns)
    written_app = URLRouter([path("ws/presence/", EveryBeatWritten.as_asgi())])
    echo_app = URLRouter([path("ws/presence/", EchoConsumer.as_asgi())])
    bare_app = URLRouter([path("ws/presence/", BareEchoConsumer.as_asgi())])
    presence_group, written_group = Group("ours"), Group(WRITTEN)
    echo_group, bare_group = Group(ECHO), Group(BARE_ECHO)
    shipped = Variant(SHIPPED, presence_group, client=store.async_client)
    written = Variant(WRITTEN, written_group, client=store.async_client)
    echo, bare = Variant(ECHO, echo_group), Variant(BARE_ECHO, bare_group)
    blocking = None
    if not isinstance(store.async_client.connection_pool, redis.asyncio.BlockingConnectionPool):
        blocking = Variant(BLOCKING, presence_group, client=blocking_client(store))
    variants = [shipped, *([blocking] if blocking else []), written, echo, bare]

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
            unrecorded.returned(connection_id, transition is not None, bench.phase_on)
            if bench.phase_on:
                results = bench.results
                results["calls"] += 1
                results["trips of calls"] += trips[0]
                results["window calls"] += bench.window_on
                if transition is None:
                    results["not recorded"] += 1
                    results["window not recorded"] += bench.window_on
                    unrecorded.reasons[why[0] if why else "unexplained"] += 1
                    unrecorded.waits.append(time.perf_counter() - started)
            return transition

        started = time.perf_counter()
        for group, app, its_users in (
            (presence_group, ours_app, users),
            (written_group, written_app, writers),
            (echo_group, echo_app, users),
            (bare_group, bare_app, users),
        ):
            group.sockets = [Socket(app, user, group) for user in its_users]
            await bounded([s.open for s in group.sockets], 10)
        say(
            f"  {4 * connections:,} connections opened ({connections:,} per consumer class) in "
            f"{time.perf_counter() - started:.1f} s (not measured); then {rounds} rounds of "
            f"{warm:g} + {seconds:g} s (warm-up + counted) per variant"
        )
        # Every pool opens its connections now: their handshakes (HELLO, CLIENT SETINFO) are
        # not a heartbeat's cost.
        for client in {id(v.client): v.client for v in variants if v.client is not None}.values():
            await asyncio.gather(*(client.ping() for _ in range(400)))
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
                await bench.phase(shipped, max(1.0, seconds / 2), 0, record=False)
        finally:
            lifecycle.aheartbeat = heartbeat  # type: ignore[assignment]
            store._connections._async_clients[asyncio.get_running_loop()] = shipped.client
            store.health.down_until = 0.0
            say(f"  phases took {time.perf_counter() - started:.0f} s")
            started = time.perf_counter()
            for group in (presence_group, written_group, echo_group, bare_group):
                await bounded([s.close for s in group.sockets], 20)
            say(f"  closed in {time.perf_counter() - started:.1f} s (not measured)")

    for variant in variants:
        line = (
            f"  {variant.label:<32} {variant.rate():>7,.0f} frames/s (median of "
            + ", ".join(f"{p.rate:,.0f}" for p in variant.phases)
            + f"); {variant.cpu_per_frame() * 1e6:,.0f} µs CPU per frame"
        )
        if variant.client is not None:
            counted = sum(p.seconds for p in variant.phases)
            line += (
                "; heartbeats written per phase "
                + ", ".join(f"{p.written:,}" for p in variant.phases)
                + f" ({variant.written_per_second_of_phase():,.0f}/s over the phases, "
                f"{variant.written_rate():,.0f}/s in the counted windows)"
                f"; per written heartbeat {figure(variant.per_written('store_trips'), '.3f')}"
                f" store round trips, {figure(variant.per_written('commands'), '.2f')} commands"
                f"; other Redis round trips {variant.total('other_trips') / counted:.1f}/s"
                f"; not recorded {variant.not_recorded()}"
                f" ({bench.unrecorded[variant.label].describe()})"
                f"; store outages declared {variant.total('store_failures')}"
                f"; Redis clients up to {max(p.redis_clients for p in variant.phases)}"
            )
        say(line)
    if warnings.total():
        warnings.show()

    attempted = shipped.total("calls")
    nothing = "nothing measured: no heartbeat written in the counted phases"
    report.add(NAME, "connections per consumer process", f"{connections:,}")
    report.add(
        NAME,
        "ours: frames handled/s; heartbeats written per phase (most frames are throttled beats:"
        " unchanged within HEARTBEAT_INTERVAL/2 of the last write, nothing written)",
        f"{shipped.rate():,.0f}; "
        + ", ".join(f"{p.written:,}" for p in shipped.phases)
        + f" ({shipped.written_per_second_of_phase():,.0f}/s over the phases, warm-up included)",
    )
    report.add(
        NAME,
        "ours: heartbeats not recorded in Redis (of the writes attempted)",
        f"{shipped.not_recorded()}; {shipped.total('store_failures')} outages declared",
        "0",
        attempted > 0 and shipped.total("not_recorded") == 0,
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
        f"{missed.still_unwritten():,}" if attempted else "nothing measured: no write attempted",
        "0",
        attempted > 0 and missed.still_unwritten() == 0,
    )
    trips = shipped.per_written("store_trips")
    report.add(
        NAME,
        "ours: Redis round trips per written heartbeat (sent within its aheartbeat call)",
        nothing
        if trips is None
        else f"{trips:.3f} store: {shipped.total('store_trips'):,} pipelines for"
        f" {shipped.written():,} written (the live writes of one loop moment share one;"
        f" {shipped.total('set_up_trips')} trips to set up new store connections)",
        "1",
        trips is not None and round(trips, 2) <= 1.0,
    )
    report.add(
        NAME,
        "ours: Redis commands per written heartbeat (all the phase's, sweeps included)",
        figure(shipped.per_written("commands"), ".2f"),
    )
    report.add(NAME, "echo: frames handled/s", f"{echo.rate():,.0f}")
    report.add(NAME, "echo without the per-frame tidy: frames handled/s", f"{bare.rate():,.0f}")
    ratio = shipped.rate() / bare.rate() if bare.rate() else 0.0
    report.add(
        NAME,
        "ours/echo frames/s (the echo without the per-frame tidy; with it; ours' frames are"
        " mostly throttled beats, its written heartbeats/s beside)",
        f"{ratio:.2f} ({shipped.rate() / max(1e-9, echo.rate()):.2f});"
        f" ours wrote {shipped.written_per_second_of_phase():,.0f} heartbeats/s",
        "≥ 0.6",
        ratio >= 0.6,
    )
    report.add(
        NAME,
        "ours/echo CPU per frame (the echo without the per-frame tidy)",
        f"{shipped.cpu_per_frame() / max(1e-12, bare.cpu_per_frame()):.1f}x",
    )
    cpu = written.cpu_per_written()
    report.add(
        NAME,
        f"{WRITTEN}: written heartbeats/s; CPU per written heartbeat; the echo's frames/s",
        f"{written.written_rate():,.0f}; {figure(None if cpu is None else cpu * 1e6, ',.0f')} µs;"
        f" {bare.rate():,.0f} (with the per-frame tidy {echo.rate():,.0f})",
    )
    report.add(
        NAME,
        f"{WRITTEN}: store round trips; Redis commands per written heartbeat; not recorded",
        f"{figure(written.per_written('store_trips'), '.3f')};"
        f" {figure(written.per_written('commands'), '.2f')}; {written.not_recorded()}",
    )
    if blocking is not None:
        report.add(
            NAME,
            f"{BLOCKING}: frames/s; heartbeats written per phase; not recorded",
            f"{blocking.rate():,.0f}; "
            + ", ".join(f"{p.written:,}" for p in blocking.phases)
            + f"; {blocking.not_recorded()}",
        )
        report.add(
            NAME,
            f"{BLOCKING}: round trips/written; echo/it frames/s, it/echo CPU",
            f"{figure(blocking.per_written('store_trips'), '.2f')};"
            f" {echo.rate() / blocking.rate():.1f}x,"
            f" {blocking.cpu_per_frame() / echo.cpu_per_frame():.1f}x",
        )
        await blocking.client.aclose()
    await store.aclose()
    flush(stats)
    stats.close()


def run(sizes: Sizes, report: Report) -> None:
    connections = 50 if report.quick else 2000
    rounds, seconds, warm = (1, 0.5, 0.2) if report.quick else (3, 4.0, 2.0)
    say(f"\n== heartbeats: {connections:,} open connections on one consumer process ==")
    flush(raw_client())
    users = make_users(BASE_ID, connections, "beat")
    writers = make_users(WRITERS_BASE_ID, connections, "beatwritten")
    # Its sockets open without a subscription, so each would hold its place among the openings
    # for OPENING_HOLD (2,000 of them 24 at a time: past the 120 s an opening is waited for).
    # What the openings cost is admission_flood's and page_views'; here they all open at once.
    limits = {"RATE_LIMIT": (10**9, 1), "OPENINGS_AT_ONCE": 2 * connections}
    with override_settings(PRESENCE=limits):
        run_async(main(report, users, writers, connections, rounds, seconds, warm))
