"""fanout: one presence change of a user with many connected subscribers on one process.

The target T has a live connection (recorded with ``lifecycle.aheartbeat``, as its consumer
would) and
lets every subscriber see it (a ``Contact`` row T -> subscriber: contacts visibility, the
default). Each subscriber is one ``PresenceConsumer`` driven through a ``WebsocketCommunicator``
in this process and event loop, subscribed to T only; the channel layer is the real
channels_redis layer of the settings, the store the real Redis.

Changes alternate: ``api.aset_status(T, "dnd")``, ``api.aset_status(T, "auto")`` (the database
write, ``presence_changed`` after commit, ``announce.announce`` from the sync thread), then
``lifecycle.aheartbeat(T, ..., idle=True)`` and ``idle=False`` (the consumer's path: Redis write,
``announce.aannounce``). Each one is visible to every subscriber, so every subscriber must receive
exactly one ``presence_diff`` with the expected status (checked).

Latency = from just before the change call to the moment the consumer hands the diff to the
ASGI server (the communicator's output queue: where daphne would write it to the socket).
The hub delivers at the ticks of a fixed grid (one every COALESCE_WINDOW of the loop's clock):
the measured changes are made at phases spread evenly over it (the i-th of n at i/n of a
window after a tick), so the figures hold changes made just after a tick (waiting almost a
window) as well as just before one; made at one phase each, they would all wait the same.
Broken down with marks on the process's hub: change -> hub notified (write, announce, channel
layer), hub notified -> delivery starts (the coalescing window: 0 to W by the phase, W/2 on
average), delivery start -> resolved
(``apresence_for_viewers``: one Redis read, three queries for all viewers), resolved -> each
diff sent.

Side by side, the naive design on the same users: every connection joins the channel-layer
group of T itself and resolves each change on its own with ``api.aget_presence`` (one query and
one Redis read per connection and change), with no coalescing window.

Counted per change: Redis round trips on the client (redis-py writes one pipeline, or one
command, with one ``send_packed_command`` call; store vs channel layer told apart by whether the
call happens inside ``PresenceStore.run/arun``), Redis commands executed by the server (``INFO
commandstats`` delta, commands run inside scripts included; the hub's once-a-second sweep is
subtracted: it is measured alone first), and SQL statements from every thread (counted in
Django's ``CursorWrapper``).

This module also holds the harness pieces bench_heartbeats and bench_connections use.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import redis
import redis.asyncio.connection as redis_async_connection
import redis.connection as redis_sync_connection
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.db.backends.utils import CursorWrapper
from django.urls import path

from benchmarks.common import (
    ID_RANGES,
    Report,
    Sizes,
    command_stats,
    flush,
    median,
    ms,
    raw_client,
    say,
)
from presence import api, lifecycle
from presence import store as store_module
from presence.announce import group_name
from presence.collector import collect_in_short_pauses, stop_collecting_in_short_pauses
from presence.conf import get_settings
from presence.domain import Presence, visibly_differs
from presence.hub import Hub
from presence.models import Contact
from presence.routing import websocket_urlpatterns

NAME = "fanout"
#: user ids of this benchmark (clear of the other benchmarks' ids: common.ID_RANGES)
BASE_ID = ID_RANGES[NAME].start
TARGET_CONNECTION = "bench-target"

T = TypeVar("T")

# --- harness shared with bench_heartbeats and bench_connections -------------------------------

#: what the current task is doing: "change" (default), "deliver" (resolving a change for its
#: viewers) or "sweep" (the hub's background sweep); propagated into sync_to_async threads
PHASE: ContextVar[str] = ContextVar("presence_bench_phase", default="change")
_IN_STORE: ContextVar[bool] = ContextVar("presence_bench_in_store", default=False)
#: True while redis-py sets up a new connection (HELLO, CLIENT SETINFO...): a pool growing
_SETTING_UP: ContextVar[bool] = ContextVar("presence_bench_setting_up", default=False)
#: Set by a caller to a one-item list: every round trip made within its context adds 1 to it,
#: counted or not (a call started before the count and returning during it is whole), except
#: those setting up a new connection.
TRIPS_OF_CALL: ContextVar[list[int] | None] = ContextVar("presence_bench_trips", default=None)


@dataclass
class Tally:
    """Redis round trips and SQL statements while ``active``, by who sent them and phase."""

    active: bool = False
    #: "store:<phase>" or "channel layer:<phase>" -> round trips
    trips: Counter[str] = field(default_factory=Counter)
    #: phase -> SQL statements
    queries: Counter[str] = field(default_factory=Counter)
    #: pipelines the store executed (successful or not)
    store_plans: int = 0
    #: times the store declared Redis unavailable (presence.store.Health.failed)
    store_failures: int = 0
    #: round trips (counted in ``trips`` too) that set up a new Redis connection
    set_up_trips: Counter[str] = field(default_factory=Counter)
    #: hub sweeps run
    sweeps: int = 0
    #: perf_counter() when apresence_for_viewers last returned
    resolved_at: float = 0.0

    def reset(self) -> None:
        self.trips.clear()
        self.queries.clear()
        self.store_plans = 0
        self.store_failures = 0
        self.set_up_trips.clear()
        self.sweeps = 0

    def round_trips(self, who: str = "", skip_sweep: bool = True) -> int:
        return sum(
            n
            for key, n in self.trips.items()
            if key.startswith(who) and not (skip_sweep and key.endswith(":sweep"))
        )

    def statements(self, skip_sweep: bool = True) -> int:
        return sum(n for phase, n in self.queries.items() if not (skip_sweep and phase == "sweep"))


@contextmanager
def instrumented() -> Iterator[Tally]:
    """Count Redis round trips (all redis-py clients of this process, all threads), SQL
    statements (all threads) and store outages while ``tally.active``; tag phases."""
    tally = Tally()
    patches: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, new: Any) -> None:
        patches.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, new)

    def count_trip() -> None:
        setting_up = _SETTING_UP.get()
        if tally.active:
            who = "store" if _IN_STORE.get() else "channel layer"
            tally.trips[f"{who}:{PHASE.get()}"] += 1
            if setting_up:
                tally.set_up_trips[who] += 1
        sink = TRIPS_OF_CALL.get()
        if sink is not None and not setting_up:
            sink[0] += 1

    async_send = redis_async_connection.AbstractConnection.send_packed_command
    sync_send = redis_sync_connection.AbstractConnection.send_packed_command

    async_set_up = redis_async_connection.AbstractConnection.on_connect_check_health

    async def async_on_connect_check_health(self: Any, check_health: bool = True) -> None:
        token = _SETTING_UP.set(True)
        try:
            await async_set_up(self, check_health)
        finally:
            _SETTING_UP.reset(token)

    async def async_send_packed_command(self: Any, command: Any, check_health: bool = True) -> Any:
        count_trip()
        return await async_send(self, command, check_health)

    def sync_send_packed_command(self: Any, command: Any, check_health: bool = True) -> Any:
        count_trip()
        return sync_send(self, command, check_health)

    store_cls = store_module.PresenceStore
    arun, run = store_cls.arun, store_cls.run

    async def store_arun(self: Any, plan: Any, **kwargs: Any) -> Any:
        token = _IN_STORE.set(True)
        try:
            if tally.active:
                tally.store_plans += 1
            return await arun(self, plan, **kwargs)
        finally:
            _IN_STORE.reset(token)

    def store_run(self: Any, plan: Any) -> Any:
        token = _IN_STORE.set(True)
        try:
            if tally.active:
                tally.store_plans += 1
            return run(self, plan)
        finally:
            _IN_STORE.reset(token)

    failed = store_module.Health.failed

    def health_failed(self: Any, error: Exception, retry_interval: float) -> None:
        tally.store_failures += 1
        failed(self, error, retry_interval)

    execute = CursorWrapper._execute_with_wrappers

    def count_statement(self: Any, sql: Any, params: Any, many: Any, executor: Any) -> Any:
        if tally.active:
            tally.queries[PHASE.get()] += 1
        return execute(self, sql, params, many, executor)

    asweep, resolve = lifecycle.asweep, lifecycle.apresence_for_viewers

    async def sweep(*args: Any, **kwargs: Any) -> Any:
        if tally.active:
            tally.sweeps += 1
        token = PHASE.set("sweep")
        try:
            return await asweep(*args, **kwargs)
        finally:
            PHASE.reset(token)

    async def presence_for_viewers(*args: Any, **kwargs: Any) -> Any:
        token = PHASE.set("deliver")
        try:
            return await resolve(*args, **kwargs)
        finally:
            tally.resolved_at = time.perf_counter()
            PHASE.reset(token)

    patch(
        redis_async_connection.AbstractConnection, "send_packed_command", async_send_packed_command
    )
    patch(redis_sync_connection.AbstractConnection, "send_packed_command", sync_send_packed_command)
    patch(
        redis_async_connection.AbstractConnection,
        "on_connect_check_health",
        async_on_connect_check_health,
    )
    patch(store_cls, "arun", store_arun)
    patch(store_cls, "run", store_run)
    patch(store_module.Health, "failed", health_failed)
    patch(CursorWrapper, "_execute_with_wrappers", count_statement)
    patch(lifecycle, "asweep", sweep)
    patch(lifecycle, "apresence_for_viewers", presence_for_viewers)
    try:
        yield tally
    finally:
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)


class WarningCounter(logging.Handler):
    """Presence's warnings (Redis outages, channel-layer failures) during a benchmark."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages[record.getMessage()[:110]] += 1

    def total(self) -> int:
        return sum(self.messages.values())

    def count(self, fragment: str) -> int:
        return sum(n for message, n in self.messages.items() if fragment in message)

    def show(self) -> None:
        for message, n in self.messages.most_common(4):
            say(f"    presence warning x{n}: {message}")


@contextmanager
def counting_warnings() -> Iterator[WarningCounter]:
    logger = logging.getLogger("presence")
    counter = WarningCounter()
    logger.addHandler(counter)
    try:
        yield counter
    finally:
        logger.removeHandler(counter)


def make_users(base: int, count: int, prefix: str) -> list[Any]:
    """``count`` users with ids ``base..base+count-1`` (bulk_create; existing ones are kept)."""
    user_model = get_user_model()
    users = [
        user_model(id=base + i, username=f"{prefix}{base + i}", password="!") for i in range(count)
    ]
    user_model._default_manager.bulk_create(users, batch_size=1000, ignore_conflicts=True)
    return users


async def bounded(jobs: Iterable[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Run the jobs, at most ``limit`` at a time (setup bursts stay below the Redis pools'
    100 connections: see the report of bench_heartbeats)."""
    semaphore = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[T]]) -> T:
        async with semaphore:
            return await job()

    return await asyncio.gather(*(one(job) for job in jobs))


async def close_all(
    comms: Iterable[WebsocketCommunicator], limit: int = 10, timeout: float = 10
) -> int:
    """Disconnect every communicator (after the measurement); returns how many failed or did
    not finish within ``timeout`` (and were cancelled)."""
    failures = 0

    async def close(comm: WebsocketCommunicator) -> None:
        nonlocal failures
        try:
            await comm.disconnect(timeout=timeout)
        except Exception:
            failures += 1

    await bounded([partial(close, comm) for comm in comms], limit)
    return failures


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, except that at the end tasks left running are cancelled again and
    again (for up to 10 s) instead of being waited for forever: ``await sync_to_async(...)``
    swallows a cancellation that arrives while its thread runs (asgiref waits for the thread and
    returns its result), so a ``while True`` loop around one, such as the hub's sweep loop, can
    outlive a cancel. Such tasks are reported."""
    loop = asyncio.new_event_loop()
    try:
        result = loop.run_until_complete(main)
        survivors: Counter[str] = Counter()
        deadline = time.monotonic() + 10
        while tasks := asyncio.all_tasks(loop):
            if time.monotonic() > deadline:
                say(f"  ({len(tasks)} task(s) still running after 10 s of cancelling: left)")
                break
            for task in tasks:
                task.cancel()
            _, pending = loop.run_until_complete(asyncio.wait(tasks, timeout=0.5))
            survivors.update(getattr(t.get_coro(), "__qualname__", "?") for t in pending)
        if survivors:
            say(
                "  (tasks that outlived a cancel at the end: "
                + ", ".join(f"{name} x{n}" for name, n in survivors.items())
                + ")"
            )
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        return result
    finally:
        loop.close()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def server_commands(client: redis.Redis) -> Counter[str]:
    """Commands executed by Redis so far, by name (INFO commandstats), without INFO itself."""
    return Counter(
        {name: calls for name, (calls, _) in command_stats(client).items() if name != "info"}
    )


def rss_bytes() -> int:
    """Resident set size of this process (/proc/self/statm)."""
    import os

    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --- this benchmark ---------------------------------------------------------------------------


class NaiveConsumer(AsyncWebsocketConsumer):
    """The design the hub replaces: each connection has a channel of its own, joins the
    channel-layer group of each user it subscribes to, and resolves each change itself.

    At most 50 of them resolve at once: the store's async pool holds at most 100 connections and
    fails beyond (the heartbeats benchmark shows it); the reads wait for the database's one
    thread anyway."""

    resolving: asyncio.Semaphore | None = None

    async def connect(self) -> None:
        self.user = self.scope["user"]
        self.connection_id = uuid.uuid4().hex[:16]
        self.sent: dict[int, Presence] = {}
        await self.accept()
        await lifecycle.aheartbeat(self.user, self.connection_id, "web")

    async def disconnect(self, code: int) -> None:
        for uid in self.sent:
            await self.channel_layer.group_discard(group_name(uid), self.channel_name)
        await lifecycle.adisconnect(self.user, self.connection_id)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        users = [int(uid) for uid in json.loads(text_data or "{}")["users"]]
        for uid in users:
            await self.channel_layer.group_add(group_name(uid), self.channel_name)
        presences = await api.abulk_presence(users, self.user)
        self.sent.update(presences)
        await self.send_presences("presence_state", presences)

    async def presence_changed(self, event: dict[str, Any]) -> None:
        """The message announce.aannounce sends ("presence.changed") to the user's group."""
        token = PHASE.set("deliver")
        try:
            for uid in event["users"]:
                if uid not in self.sent:
                    continue
                assert NaiveConsumer.resolving is not None
                async with NaiveConsumer.resolving:
                    presence = await api.aget_presence(uid, self.user)
                if visibly_differs(self.sent[uid], presence):
                    self.sent[uid] = presence
                    await self.send_presences("presence_diff", {uid: presence})
        finally:
            PHASE.reset(token)

    async def send_presences(self, kind: str, presences: dict[int, Presence]) -> None:
        content = {"type": kind, "presences": {str(u): p.as_dict() for u, p in presences.items()}}
        await self.send(text_data=json.dumps(content, separators=(",", ":")))


class Round:
    """Arrivals of one change's diffs: the first diff with the expected status for each
    subscriber; diffs with another status are counted as wrong."""

    def __init__(self, subscribers: int, status: str) -> None:
        self.subscribers = subscribers
        self.fragment = f'"status":"{status}"'
        self.arrivals: dict[Subscriber, float] = {}
        self.wrong = 0
        self.done = asyncio.Event()
        self.notified = self.deliver_start = self.resolved = self.deliver_end = 0.0

    def arrived(self, subscriber: Subscriber, at: float, text: str) -> None:
        if self.fragment not in text:
            self.wrong += 1
        elif subscriber not in self.arrivals:
            self.arrivals[subscriber] = at
            if len(self.arrivals) == self.subscribers:
                self.done.set()


class Subscriber:
    """One WebSocket connection; stamps the time each presence_diff leaves the consumer."""

    def __init__(self, app: Any, user: Any) -> None:
        self.comm = WebsocketCommunicator(app, "/ws/presence/")
        self.comm.scope["user"] = user
        self.round: Round | None = None
        queue = self.comm.output_queue
        put_nowait = queue.put_nowait

        def stamped(message: dict[str, Any]) -> None:
            current, text = self.round, message.get("text") or ""
            if current is not None and '"presence_diff"' in text:
                current.arrived(self, time.perf_counter(), text)
            put_nowait(message)

        queue.put_nowait = stamped  # type: ignore[method-assign]

    async def open(self, target: int) -> None:
        connected, _ = await self.comm.connect(timeout=60)
        if not connected:
            raise RuntimeError("a subscriber's connection was refused")
        await self.comm.send_json_to({"type": "subscribe", "users": [target]})
        state = await self.comm.receive_json_from(timeout=60)
        if state.get("type") != "presence_state" or str(target) not in state["presences"]:
            raise RuntimeError(f"unexpected answer to subscribe: {state}")

    def drain(self) -> list[dict[str, Any]]:
        frames = []
        queue = self.comm.output_queue
        while not queue.empty():
            message = queue.get_nowait()
            if message.get("type") == "websocket.send":
                frames.append(json.loads(message["text"]))
        return frames


#: (kind, on) in the order they are applied; each is visible to every subscriber
CHANGES = (("status", True), ("status", False), ("heartbeat", True), ("heartbeat", False))
EXPECTED = {
    ("status", True): "dnd",
    ("status", False): "online",
    ("heartbeat", True): "idle",
    ("heartbeat", False): "online",
}
RECEIVE_FAILED = "channel layer receive failed"


@dataclass
class ChangeResult:
    kind: str
    latencies: list[float]
    to_hub: float = 0.0
    window: float = 0.0
    resolve: float = 0.0
    send: float = 0.0
    trips_store: int = 0
    trips_layer: int = 0
    commands: int = 0
    statements: int = 0
    statements_deliver: int = 0
    #: subscribers without a diff showing the expected status (within 30 s)
    missing: int = 0
    #: diffs showing another status
    wrong: int = 0
    #: diffs beyond one per subscriber
    extra: int = 0


@dataclass
class Approach:
    label: str
    results: list[ChangeResult] = field(default_factory=list)
    sweeps: int = 0
    store_failures: int = 0
    command_names: Counter[str] = field(default_factory=Counter)

    def latencies(self, kind: str | None = None) -> list[float]:
        return [t for r in self.results if kind in (None, r.kind) for t in r.latencies]

    def processing(self) -> list[float]:
        """The latencies without the coalescing window (the time the hub waited on purpose)."""
        return [t - r.window for r in self.results for t in r.latencies]

    def per_change(self, attribute: str, kind: str | None = None) -> float:
        values = [getattr(r, attribute) for r in self.results if kind in (None, r.kind)]
        return sum(values) / len(values)

    def faults(self) -> tuple[int, int, int]:
        """Subscribers left without the expected diff, diffs with another status, extra diffs."""
        return (
            sum(r.missing for r in self.results),
            sum(r.wrong for r in self.results),
            sum(r.extra for r in self.results),
        )

    def trips(self, kind: str | None = None) -> float:
        return self.per_change("trips_store", kind) + self.per_change("trips_layer", kind)


class Fanout:
    """Subscribers of one target on one approach, and the changes measured on them."""

    def __init__(
        self,
        approach: Approach,
        subscribers: list[Subscriber],
        target: Any,
        tally: Tally,
        stats: redis.Redis,
        sweep_commands: Counter[str],
    ) -> None:
        self.approach = approach
        self.subscribers = subscribers
        self.target = target
        self.tally = tally
        self.stats = stats
        self.sweep_commands = sweep_commands
        self.current: Round | None = None
        self.step = 0

    def instrument(self, hub: Hub) -> None:
        """Marks on the hub: when it learns of the change, when delivery starts and ends."""
        changed, deliver = hub.changed, hub.deliver
        target_id = self.target.pk

        def marking_changed(user_ids: Iterable[int], **kwargs: Any) -> None:
            ids = list(user_ids)
            current = self.current
            if current is not None and target_id in ids and not current.notified:
                current.notified = time.perf_counter()
            changed(ids, **kwargs)

        async def marking_deliver(user_ids: Iterable[int]) -> None:
            ids = list(user_ids)
            current = self.current
            if current is None or target_id not in ids:
                await deliver(ids)
                return
            current.deliver_start = time.perf_counter()
            await deliver(ids)
            current.resolved = self.tally.resolved_at
            current.deliver_end = time.perf_counter()

        hub.changed = marking_changed  # type: ignore[method-assign]
        hub.deliver = marking_deliver  # type: ignore[method-assign]

    async def quiet(self) -> None:
        """Wait until the change's work is over: no Redis round trip or SQL statement for
        100 ms (the naive consumers resolve a change once per announcement, and a status change
        is announced twice: see the report)."""
        tally = self.tally
        seen = -1
        while True:
            now = sum(tally.trips.values()) + sum(tally.queries.values())
            if now == seen:
                return
            seen = now
            await asyncio.sleep(0.1)

    async def change(self, record: bool = True, phase: float | None = None) -> ChangeResult:
        """Apply the next change (at ``phase``, 0 to 1, of a window of the hub's grid, if
        given); wait until every subscriber has its diff; check them."""
        if phase is not None:
            await at_grid_phase(phase, get_settings().COALESCE_WINDOW)
        kind, on = CHANGES[self.step % len(CHANGES)]
        self.step += 1
        want = EXPECTED[(kind, on)]
        current = self.current = Round(len(self.subscribers), want)
        for subscriber in self.subscribers:
            subscriber.round = current
        tally = self.tally
        before = server_commands(self.stats)
        tally.reset()
        tally.active = True
        started = time.perf_counter()
        await apply_change(self.target, kind, on)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(current.done.wait(), 30)
        await self.quiet()
        tally.active = False
        self.current = None
        result = ChangeResult(kind, [at - started for at in current.arrivals.values()])
        result.missing = len(self.subscribers) - len(current.arrivals)
        result.wrong = current.wrong
        if not result.latencies:
            result.latencies = [float("inf")]
        if current.notified:
            result.to_hub = current.notified - started
            result.window = current.deliver_start - current.notified
            result.resolve = current.resolved - current.deliver_start
            result.send = current.deliver_end - current.resolved
        else:
            result.send = max(result.latencies) - min(result.latencies)
        # The hub's sweep (every SWEEP_INTERVAL) may run meanwhile: its round trips are tagged
        # and left out, its commands subtracted as measured alone.
        delta = server_commands(self.stats) - before
        for name, calls in self.sweep_commands.items():
            delta[name] -= calls * tally.sweeps
        delta = +delta
        result.trips_store = tally.round_trips("store")
        result.trips_layer = tally.round_trips("channel layer")
        result.commands = sum(delta.values())
        result.statements = tally.statements()
        result.statements_deliver = tally.queries["deliver"]
        # Every subscriber is to get exactly one diff, showing the expected status.
        for subscriber in self.subscribers:
            diffs = [f for f in subscriber.drain() if f["type"] == "presence_diff"]
            result.extra += max(0, len(diffs) - 1)
        if record:
            self.approach.results.append(result)
            self.approach.sweeps += tally.sweeps
            self.approach.store_failures += tally.store_failures
            self.approach.command_names.update(delta)
        await asyncio.sleep(0.05)
        return result

    async def change_after_receive_failure(self, warnings: WarningCounter) -> float | None:
        """Wait (at most 15 s, idle) for the hub's channel-layer receive to fail, then change
        at once: the latency of that change's diffs (p99), or None if it did not fail."""
        while self.step % len(CHANGES) < 2:
            await self.change(record=False)  # the next change is a heartbeat one
        failures = warnings.count(RECEIVE_FAILED)
        deadline = time.perf_counter() + 15
        while warnings.count(RECEIVE_FAILED) == failures:
            if time.perf_counter() > deadline:
                return None
            await asyncio.sleep(0.01)
        result = await self.change(record=False)
        await self.change(record=False)
        return percentile(result.latencies, 0.99)


async def at_grid_phase(phase: float, window: float) -> None:
    """Wait until the running loop's clock (the hub's grid's) is ``phase`` (0 to 1) into one
    of the grid's windows of ``window`` seconds (presence.hub.room_windows.next_tick)."""
    if window <= 0:
        return
    into = (asyncio.get_running_loop().time() / window) % 1.0
    await asyncio.sleep(((phase - into) % 1.0) * window)


async def apply_change(target: Any, kind: str, on: bool) -> None:
    if kind == "status":
        await api.aset_status(target, "dnd" if on else "auto")
    else:
        await lifecycle.aheartbeat(target, TARGET_CONNECTION, "web", idle=on)


async def run_approach(
    label: str,
    app: Any,
    users: list[Any],
    target: Any,
    changes: int,
    tally: Tally,
    stats: redis.Redis,
    sweep_commands: Counter[str],
    warnings: WarningCounter,
    after_failure: bool = False,
    warmups: int = 2,
    close_timeout: float = 10,
) -> tuple[Approach, float | None]:
    approach = Approach(label)
    # The target starts online, without dnd, whatever the previous approach left: the changes
    # start with dnd, and each must be visible.
    await api.aset_status(target, "auto")
    await lifecycle.aheartbeat(target, TARGET_CONNECTION, "web", idle=False)
    subscribers = [Subscriber(app, user) for user in users]
    fanout = Fanout(approach, subscribers, target, tally, stats, sweep_commands)
    started = time.perf_counter()
    await bounded([partial(s.open, target.pk) for s in subscribers], 10)
    say(
        f"  {label}: {len(subscribers):,} subscribers connected and subscribed in "
        f"{time.perf_counter() - started:.1f} s (not measured)"
    )
    hub = Hub.current()
    if hub is not None and hub.registry.connections:
        fanout.instrument(hub)
    for subscriber in subscribers:
        subscriber.drain()
    delayed = None
    try:
        # Changes first, not measured: the hub's receive loop may be sleeping after a failure
        # while it was idle during the setup (see change_after_receive_failure).
        for _ in range(warmups):
            await fanout.change(record=False)
        # Spread over the grid: how long a change waits for its tick depends on when it is made.
        for i in range(changes):
            await fanout.change(phase=i / changes)
        if after_failure:
            delayed = await fanout.change_after_receive_failure(warnings)
    finally:
        started = time.perf_counter()
        failed = await close_all((s.comm for s in subscribers), timeout=close_timeout)
        say(
            f"  {label}: disconnected in {time.perf_counter() - started:.1f} s (not measured)"
            + (f"; {failed} closed with an error" if failed else "")
        )
        if hub is not None:
            for name in ("changed", "deliver"):
                hub.__dict__.pop(name, None)
    return approach, delayed


def describe(approach: Approach, window: float | None) -> None:
    for kind in ("status", "heartbeat", None):
        latencies = approach.latencies(kind)
        say(
            f"  {approach.label:<5} {kind or 'all':<9} p50 {ms(percentile(latencies, 0.5)):>11}"
            f"  p99 {ms(percentile(latencies, 0.99)):>11}  max {ms(max(latencies)):>11}"
            f" | Redis round trips {approach.per_change('trips_store', kind):6.1f} store"
            f" + {approach.per_change('trips_layer', kind):4.1f} channel layer"
            f", {approach.per_change('commands', kind):7.1f} commands"
            f" | SQL {approach.per_change('statements', kind):6.1f}"
            f" ({approach.per_change('statements_deliver', kind):.1f} delivering)"
        )
    if window is not None:
        parts = (
            ("change -> hub", "to_hub"),
            ("window", "window"),
            ("resolve", "resolve"),
            ("send all", "send"),
        )
        say(
            f"  {approach.label:<5} breakdown (medians): "
            + ", ".join(
                f"{label} {ms(median(getattr(r, attr) for r in approach.results))}"
                for label, attr in parts
            )
            + f" (COALESCE_WINDOW {window:g} s: the window's part is 0 to {window:g} s by"
            " when on the grid a change is made, half of it on average)"
        )
        for kind in ("status", "heartbeat"):
            say(
                f"        {kind}: change -> hub "
                + ms(median(r.to_hub for r in approach.results if r.kind == kind))
            )
    else:
        say(
            f"  {approach.label:<5} first diff after "
            + ms(median(min(r.latencies) for r in approach.results))
            + ", all sent within "
            + ms(median(r.send for r in approach.results))
            + " more (medians; no coalescing window)"
        )
    missing, wrong, extra = approach.faults()
    if missing or wrong or extra:
        say(
            f"  {approach.label:<5} diffs: {missing} subscribers never got the expected one "
            f"(within 30 s), {wrong} showed another status, {extra} were extra"
        )
    per_name = sorted(approach.command_names.items(), key=lambda item: -item[1])
    say(
        f"  {approach.label:<5} Redis commands per change: "
        + ", ".join(f"{name} {calls / len(approach.results):.1f}" for name, calls in per_name)
    )


async def target_online(users: list[Any]) -> tuple[redis.Redis, Any, list[Any], int]:
    """The first user online (the one who changes), and the Redis commands of one idle sweep
    (to take the hub's background sweeps out of the counts): (stats client, target, viewers,
    sweep commands)."""
    stats = raw_client(decode=True)
    target, viewers = users[0], users[1:]
    await api.aset_status(target, "auto")
    await lifecycle.aheartbeat(target, TARGET_CONNECTION, "web")
    before = server_commands(stats)
    await lifecycle.asweep()
    return stats, target, viewers, server_commands(stats) - before


async def main(report: Report, subscribers_n: int, changes: int, users: list[Any]) -> None:
    window = get_settings().COALESCE_WINDOW
    stats, target, viewers, sweep_commands = await target_online(users)
    ours_app = URLRouter(websocket_urlpatterns)
    naive_app = URLRouter([path("ws/presence/", NaiveConsumer.as_asgi())])
    NaiveConsumer.resolving = asyncio.Semaphore(50)
    layer = get_channel_layer()
    with instrumented() as tally, counting_warnings() as warnings:
        ours, delayed = await run_approach(
            "ours",
            ours_app,
            viewers,
            target,
            changes,
            tally,
            stats,
            sweep_commands,
            warnings,
            after_failure=not report.quick,
            warmups=1 if report.quick else 2,
        )
        ours_warnings = warnings.total()
        # A consumer whose channel-layer receive fails dies (Channels does not catch it), so
        # the naive consumers get an idle BZPOPMIN shorter than redis-py's 5 s socket timeout.
        layer.brpop_timeout = 4
        try:
            naive, _ = await run_approach(
                "naive",
                naive_app,
                viewers,
                target,
                changes,
                tally,
                stats,
                sweep_commands,
                warnings,
                warmups=1 if report.quick else 2,
                # A naive consumer's channel-layer receive can swallow the cancellation at
                # close and wait for its BZPOPMIN: not worth waiting for.
                close_timeout=2,
            )
        finally:
            del layer.brpop_timeout
    await lifecycle.adisconnect(target, TARGET_CONNECTION)
    describe(ours, window)
    describe(naive, None)
    say(
        f"  hub sweeps during the measured changes: {ours.sweeps} (left out of the counts: "
        f"{sum(sweep_commands.values())} commands and 1 round trip each)"
    )
    if warnings.total() or ours.store_failures or naive.store_failures:
        say(
            f"  store outages declared: ours {ours.store_failures}, naive {naive.store_failures}"
            f"; presence warnings: {ours_warnings} while ours ran"
        )
        warnings.show()

    p50, p99 = percentile(ours.latencies(), 0.5), percentile(ours.latencies(), 0.99)
    processing = ours.processing()
    n99 = percentile(naive.latencies(), 0.99)
    report.add(NAME, "subscribers x changes measured", f"{subscribers_n:,} x {changes} each")
    faults = ours.faults()
    report.add(
        NAME,
        "ours: diffs missing / wrong / extra",
        " / ".join(map(str, faults)),
        "0 / 0 / 0",
        not any(faults),
    )
    report.add(
        NAME,
        f"ours: latency p50 / p99 (0 to {window:g} s coalescing grid included)",
        f"{ms(p50)} / {ms(p99)}",
        "p99 ≤ 250 ms",
        p99 <= 0.250,
    )
    report.add(
        NAME,
        "ours: p50 / p99 without the window",
        f"{ms(percentile(processing, 0.5))} / {ms(percentile(processing, 0.99))}",
    )
    report.add(
        NAME,
        "ours: Redis round trips per change",
        f"{ours.trips():.1f} ({ours.per_change('trips_store'):.1f} store, "
        f"{ours.per_change('trips_layer'):.1f} channel layer)",
    )
    report.add(NAME, "ours: Redis commands per change", f"{ours.per_change('commands'):.1f}")
    report.add(
        NAME,
        "ours: SQL per change (status / heartbeat)",
        f"{ours.per_change('statements', 'status'):.1f} / "
        f"{ours.per_change('statements', 'heartbeat'):.1f} "
        f"(delivering: {ours.per_change('statements_deliver'):.1f})",
    )
    if delayed is not None:
        report.add(NAME, "ours: p99 of a change right after a receive timeout", ms(delayed))
    report.add(
        NAME,
        "naive: latency p50 / p99 (no window)",
        f"{ms(percentile(naive.latencies(), 0.5))} / {ms(n99)}",
    )
    report.add(NAME, "naive: diffs missing / wrong / extra", " / ".join(map(str, naive.faults())))
    report.add(
        NAME,
        "naive: Redis round trips / commands / SQL per change",
        f"{naive.trips():,.1f} / {naive.per_change('commands'):,.1f} / "
        f"{naive.per_change('statements'):,.1f}",
    )
    report.add(NAME, "naive/ours p99 latency (ours with its window)", f"{n99 / p99:.1f}x")
    report.add(
        NAME,
        "naive/ours p99 latency (ours without window)",
        f"{n99 / percentile(processing, 0.99):.1f}x",
    )
    report.add(
        NAME,
        "naive/ours Redis commands per change",
        f"{naive.per_change('commands') / ours.per_change('commands'):.1f}x",
    )
    report.add(
        NAME, "naive/ours Redis round trips per change", f"{naive.trips() / ours.trips():.1f}x"
    )
    report.add(
        NAME,
        "naive/ours SQL per change",
        f"{naive.per_change('statements') / ours.per_change('statements'):.1f}x",
    )
    await store_module.get_store().aclose()
    flush(stats)
    stats.close()


async def main_pubsub(report: Report, subscribers_n: int, changes: int, users: list[Any]) -> None:
    """The same measurement of ours on channels_redis's pub/sub layer (a fresh event loop, so
    a fresh hub on that layer)."""
    window = get_settings().COALESCE_WINDOW
    stats, target, viewers, sweep_commands = await target_online(users)
    with instrumented() as tally, counting_warnings() as warnings:
        pubsub, _ = await run_approach(
            "ours on the pub/sub layer",
            URLRouter(websocket_urlpatterns),
            viewers,
            target,
            changes,
            tally,
            stats,
            sweep_commands,
            warnings,
            warmups=1 if report.quick else 2,
        )
    await lifecycle.adisconnect(target, TARGET_CONNECTION)
    describe(pubsub, window)
    p50, p99 = percentile(pubsub.latencies(), 0.5), percentile(pubsub.latencies(), 0.99)
    processing = pubsub.processing()
    report.add(
        NAME,
        "pub/sub layer: diffs missing / wrong / extra",
        " / ".join(map(str, pubsub.faults())),
        "0 / 0 / 0",
        not any(pubsub.faults()),
    )
    report.add(
        NAME,
        f"pub/sub layer: latency p50 / p99 (0 to {window:g} s coalescing grid included; without: "
        f"{ms(percentile(processing, 0.5))} / {ms(percentile(processing, 0.99))})",
        f"{ms(p50)} / {ms(p99)}",
    )
    report.add(
        NAME,
        "pub/sub layer: Redis round trips per change",
        f"{pubsub.trips():.1f} ({pubsub.per_change('trips_layer'):.1f} channel layer)",
    )
    await store_module.get_store().aclose()
    stats.close()


@contextmanager
def collecting_as_deployed() -> Iterator[None]:
    """Collect as docs/deployment.md tells a server to (gc.freeze() at startup,
    collect_in_short_pauses()): otherwise a full collection of the 1,000 consumers' objects
    lands in a send now and then (~90 ms), and the p99 measures Python's default instead."""
    gc.freeze()
    collect_in_short_pauses()
    try:
        yield
    finally:
        stop_collecting_in_short_pauses()
        gc.unfreeze()


def run(sizes: Sizes, report: Report) -> None:
    subscribers_n = 50 if report.quick else 1000
    changes = 4 if report.quick else 20
    say(
        f"\n== fanout: one change of a user with {subscribers_n:,} connected subscribers on one "
        f"process, {changes} changes per approach =="
    )
    flush(raw_client())
    users = make_users(BASE_ID, subscribers_n + 1, "fanout")
    Contact.objects.bulk_create(
        [Contact(owner_id=users[0].pk, contact_id=v.pk) for v in users[1:]],
        batch_size=1000,
        ignore_conflicts=True,
    )
    exceptions_side_by_side(report)
    say("  (collecting as docs/deployment.md advises: gc.freeze(), collect_in_short_pauses())")
    with collecting_as_deployed():
        run_async(main(report, subscribers_n, changes, users))
    from django.conf import settings
    from django.test import override_settings

    hosts = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]
    pubsub = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": hosts},
        }
    }
    say("  -- the same on channels_redis's pub/sub layer --")
    with override_settings(CHANNEL_LAYERS=pubsub), collecting_as_deployed():
        run_async(main_pubsub(report, subscribers_n, changes, users))


def exceptions_side_by_side(report: Report) -> None:
    """The fan-out's resolution of one change for every subscriber
    (``lifecycle.apresence_for_viewers``: one Redis read and three queries for all of them),
    for a target 10 % of whose pairs with the subscribers carry an exception, side by side
    (call by call in turn) with a target of the same subscribers and none. Issue 26's goal:
    <= 1.1x the time, still one round trip and the same queries."""
    import random

    from presence.models import PrivacyException

    # 1,000 subscribers even with --quick: their own users, beside the main run's.
    base = ID_RANGES["fanout_exceptions"].start
    plain_target, excepted_target, *viewers = make_users(base, 1002, "fanout-exceptions")
    Contact.objects.bulk_create(
        [
            Contact(owner_id=t.pk, contact_id=v.pk)
            for t in (plain_target, excepted_target)
            for v in viewers
        ],
        batch_size=1000,
        ignore_conflicts=True,
    )
    pick = random.Random(26)
    settings_ = ("online_visibility", "last_seen_visibility", "activity_visibility")
    PrivacyException.objects.filter(owner_id=excepted_target.pk).delete()
    PrivacyException.objects.bulk_create(
        [
            PrivacyException(
                owner_id=excepted_target.pk,
                viewer_id=v.pk,
                setting=pick.choice(settings_),
                allow=pick.random() < 0.5,
            )
            for v in pick.sample(viewers, len(viewers) // 10)
        ],
        batch_size=1000,
    )
    viewer_ids = [v.pk for v in viewers]
    for target in (plain_target, excepted_target):
        api.touch(target)

    async def resolve(target: Any) -> tuple[float, int]:
        trips = [0]
        token = TRIPS_OF_CALL.set(trips)
        try:
            start = time.perf_counter()
            result = await lifecycle.apresence_for_viewers({target.pk: viewer_ids})
            elapsed = time.perf_counter() - start
        finally:
            TRIPS_OF_CALL.reset(token)
        assert result is not None and len(result[target.pk]) == len(viewer_ids)
        return elapsed, trips[0]

    async def measure() -> tuple[list[float], list[float], int, int]:
        with instrumented() as tally:
            await resolve(plain_target)
            await resolve(excepted_target)  # warm
            plain: list[float] = []
            excepted: list[float] = []
            trips = 0
            for _ in range(15 if report.quick else 40):
                plain.append((await resolve(plain_target))[0])
                elapsed, trips = await resolve(excepted_target)
                excepted.append(elapsed)
            tally.queries.clear()
            tally.active = True
            await resolve(excepted_target)
            tally.active = False
            queries = sum(tally.queries.values())
        return plain, excepted, trips, queries

    plain, excepted, trips, queries = run_async(measure())
    ratio = median(excepted) / median(plain)
    say(
        f"  exceptions: resolving one change for {len(viewer_ids):,} subscribers, 10 % of the "
        f"pairs with an exception: {ms(median(excepted))} vs {ms(median(plain))} without"
    )
    report.add(
        NAME,
        f"resolution for {len(viewer_ids):,} subscribers, 10 % exceptions / none, side by side",
        f"{ratio:.2f}x",
        "≤ 1.1x",
        ratio <= 1.1,
    )
    report.add(
        NAME,
        "  with exceptions: Redis round trips, DB queries",
        f"{trips}, {queries}",
        "1, 3",
        (trips, queries) == (1, 3),
    )
