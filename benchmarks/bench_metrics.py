"""metrics: what presence's Prometheus metrics cost on the two hot paths, measured side by side.

Both paths run in this process and event loop on the real store, channel layer and database,
with ``presence.metrics`` switched on (as shipped with prometheus_client installed) and off
(``metrics.switch(False)``: every hook returns at once, as without prometheus_client), phase by
phase in the order on, off, off, on, ... so that a drift of the machine weighs on both alike:

- **heartbeats**: ``PresenceConsumer`` connections driven through the ASGI application as
  bench_heartbeats drives them (each always has one heartbeat frame being handled; the rate
  limit lifted). Per phase: frames handled and the process's CPU time; the cost is CPU per frame.
- **fan-out**: one user T whose every subscriber may see them, each subscriber a
  ``PresenceConsumer`` subscribed to T; T's connection turns idle and active in turn
  (``lifecycle.aheartbeat``, the consumer's path: Redis write, announcement on the channel layer,
  the hub's coalescing and delivery, one ``presence_diff`` per subscriber). A change counts as
  done when every subscriber was handed its diff; the cost is the process's CPU per change.

The process's CPU time, not wall time: other processes on the machine slow both variants, and
CPU time counts only this one's work (its threads included: the database's). The overhead is
CPU with metrics over CPU without, minus one. Beside it, the hooks' own cost per event from a
tight loop (µs per call), for a figure that the machine's noise does not blur.
"""

from __future__ import annotations

import asyncio
import json
import time
import timeit
from typing import Any

from channels.routing import URLRouter
from django.test.utils import override_settings

from benchmarks.bench_fanout import (
    apply_change,
    bounded,
    make_users,
    run_async,
    target_online,
)
from benchmarks.bench_heartbeats import Group, Socket
from benchmarks.common import Report, Sizes, flush, median, raw_client, say
from presence import domain, metrics
from presence import store as store_module
from presence.models import Contact
from presence.routing import websocket_urlpatterns

NAME = "metrics"
HEARTBEAT_BASE_ID = 23_000_000
FANOUT_BASE_ID = 23_500_000
#: the overhead's goal on each hot path
GOAL = 0.02
#: the rate limit lifted (this measures capacity), a short coalescing window (quick changes),
#: the hub's sweep out of the way
PRESENCE = {"RATE_LIMIT": (10**9, 1), "COALESCE_WINDOW": 0.01, "SWEEP_INTERVAL": 3600}


class Watcher:
    """A subscriber of T driven through the ASGI application: connects, subscribes, then
    counts the diffs it is handed."""

    def __init__(self, app: Any, user: Any, target_id: int, fanout: Fanout) -> None:
        self.fanout = fanout
        self.step = 0
        self.subscribed = asyncio.Event()
        self.closing = asyncio.Event()
        self.frame = json.dumps({"type": "subscribe", "users": [target_id]})
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
        self.step += 1
        if self.step == 1:
            return {"type": "websocket.connect"}
        if self.step == 2:
            return {"type": "websocket.receive", "text": self.frame}
        await self.closing.wait()
        return {"type": "websocket.disconnect", "code": 1000}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "websocket.close":
            raise RuntimeError("the consumer closed a subscriber's connection")
        text = message.get("text") or ""
        if text.startswith('{"type":"presence_state"'):
            self.subscribed.set()
        elif text.startswith('{"type":"presence_diff"'):
            self.fanout.received()

    async def close(self) -> None:
        self.closing.set()
        await asyncio.wait_for(self.task, 120)


class Fanout:
    """Counts the diffs of the change under way."""

    def __init__(self, subscribers: int) -> None:
        self.subscribers = subscribers
        self.diffs = 0
        self.done = asyncio.Event()

    def received(self) -> None:
        self.diffs += 1
        if self.diffs >= self.subscribers:
            self.done.set()

    async def change(self, target: Any, on: bool) -> None:
        self.diffs = 0
        self.done.clear()
        await apply_change(target, "heartbeat", on)
        await asyncio.wait_for(self.done.wait(), 60)


class Costs:
    """A path's cost (CPU seconds per frame or change) in each measured phase, by variant."""

    def __init__(self) -> None:
        self.phases: dict[bool, list[float]] = {True: [], False: []}

    def add(self, on: bool, spent: float, count: int) -> None:
        self.phases[on].append(spent / max(1, count))

    def __getitem__(self, on: bool) -> float:
        return median(self.phases[on])

    def overhead(self) -> float:
        """The median phase with metrics over the median phase without, minus one."""
        return self[True] / self[False] - 1

    def spread(self) -> float:
        """How much phases of one variant differ among themselves (half their range over the
        median, the worse variant): the machine's noise, against which the overhead is read."""
        return max(
            (max(phases) - min(phases)) / 2 / median(phases) for phases in self.phases.values()
        )


def _order(rounds: int) -> list[bool]:
    """on, off, off, on, on, off, ...: each variant as often first as second."""
    order: list[bool] = []
    for i in range(rounds):
        order += [True, False] if i % 2 == 0 else [False, True]
    return order


async def heartbeats(connections: list[Any], rounds: int, seconds: float, interval: float) -> Costs:
    """CPU per heartbeat frame, seconds, with metrics on (True) and off (False). A connection
    writes a heartbeat to Redis once per half ``interval`` (HEARTBEAT_INTERVAL): 30 s, most
    of these flat-out frames write nothing; 0.001 s, every one is recorded, as each heartbeat
    of a real client (one per HEARTBEAT_INTERVAL) is."""
    with override_settings(PRESENCE={**PRESENCE, "HEARTBEAT_INTERVAL": interval}):
        return await _heartbeats(connections, rounds, seconds)


async def _heartbeats(connections: list[Any], rounds: int, seconds: float) -> Costs:
    app = URLRouter(websocket_urlpatterns)
    group = Group("ours")
    group.sockets = [Socket(app, user, group) for user in connections]
    await bounded([s.open for s in group.sockets], 10)
    costs = Costs()
    try:
        for index, on in enumerate([True, False, *_order(rounds)]):
            metrics.switch(on)
            group.start()
            await asyncio.sleep(seconds / 4)  # warm: every socket has a frame in flight
            group.handled = 0
            group.counting = True
            started = time.process_time()
            await asyncio.sleep(seconds)
            spent = time.process_time() - started
            handled = group.handled
            group.counting = False
            await group.stop()
            if index >= 2:  # one unmeasured phase of each first
                costs.add(on, spent, handled)
    finally:
        metrics.switch(True)
        for socket in group.sockets:
            await socket.close()
    return costs


async def fanout(users: list[Any], rounds: int, changes: int) -> tuple[Costs, int]:
    """CPU per change delivered to every subscriber, seconds, with metrics on and off."""
    _, target, viewers, _ = await target_online(users)
    app = URLRouter(websocket_urlpatterns)
    tally = Fanout(len(viewers))
    watchers = [Watcher(app, user, target.pk, tally) for user in viewers]

    await asyncio.wait_for(asyncio.gather(*(w.subscribed.wait() for w in watchers)), 300)
    costs = Costs()
    state = False
    try:
        for index, on in enumerate([True, False, *_order(rounds)]):
            metrics.switch(on)
            started = time.process_time()
            for _ in range(changes):
                state = not state
                await tally.change(target, state)
            spent = time.process_time() - started
            if index >= 2:
                costs.add(on, spent, changes)
    finally:
        metrics.switch(True)
        for watcher in watchers:
            await watcher.close()
    return costs, len(viewers)


def hook_costs() -> dict[str, float]:
    """µs per call of the hooks on the hot paths, switched on, from a tight loop."""
    heartbeat = domain.Heartbeat(domain.HeartbeatState.ACTIVE)
    calls = {
        "frame_received": lambda: metrics.frame_received(heartbeat),
        "frame_sent": lambda: metrics.frame_sent("presence_diff"),
        "redis_round_trip": lambda: metrics.redis_round_trip("redis", 0.0002),
        "delivered (one user)": lambda: metrics.delivered([1.0], 1.1, 0.2),
    }
    n = 50_000
    metrics.switch(True)
    return {
        name: timeit.timeit(call, number=n, timer=time.process_time) / n * 1e6
        for name, call in calls.items()
    }


async def main(
    report: Report,
    beaters: list[Any],
    subscribers: list[Any],
    rounds: int,
    seconds: float,
    changes: int,
) -> None:
    throttled = await heartbeats(beaters, rounds, seconds, 30)
    recorded = await heartbeats(beaters, rounds, seconds, 0.001)
    fan, viewers = await fanout(subscribers, rounds, changes)
    await store_module.get_store().aclose()
    costs = hook_costs()
    if not metrics.AVAILABLE:
        report.add(NAME, "prometheus_client", "not installed: nothing to compare")
        return
    for label, beat in (("throttled", throttled), ("recorded", recorded)):
        say(
            f"  heartbeats, {label}: {beat[True] * 1e6:,.1f} µs CPU per frame with metrics, "
            f"{beat[False] * 1e6:,.1f} µs without ({len(beaters):,} connections, {rounds} "
            f"phases of {seconds:g} s each)"
        )
    say(
        f"  fan-out: {fan[True] * 1e3:,.2f} ms CPU per change to {viewers:,} subscribers "
        f"with metrics, {fan[False] * 1e3:,.2f} ms without ({rounds} x {changes} changes each)"
    )
    say("  hooks (CPU): " + ", ".join(f"{name} {us:.2f} µs" for name, us in costs.items()))
    for path, cost in (
        ("heartbeats, each recorded in Redis (as clients send them): CPU per frame", recorded),
        ("heartbeats, flat out, most not written (throttled): CPU per frame", throttled),
        ("fan-out: CPU per change", fan),
    ):
        overhead = cost.overhead()
        say(f"  {path}: with metrics {_us(cost.phases[True])}; without {_us(cost.phases[False])}")
        report.add(
            NAME,
            f"{path}, metrics on/off",
            f"{overhead:+.1%} (phases of one variant vary ±{cost.spread():.1%})",
            f"≤ +{GOAL:.0%}",
            overhead <= GOAL,
        )
    # From the hooks' own cost: per heartbeat one frame received and one round trip (none when
    # throttled); per change three round trips, a delivery and a frame per subscriber.
    per_beat = costs["frame_received"] + costs["redis_round_trip"]
    per_throttled = costs["frame_received"]
    per_change = 3 * costs["redis_round_trip"] + costs["delivered (one user)"]
    per_change += viewers * costs["frame_sent"]
    shares = (
        per_beat / (recorded[False] * 1e6),
        per_throttled / (throttled[False] * 1e6),
        per_change / (fan[False] * 1e6),
    )
    report.add(
        NAME,
        "hooks' own CPU (share of the path without metrics): recorded heartbeat; throttled; change",
        f"{per_beat:.2f} µs ({shares[0]:.2%}); {per_throttled:.2f} µs ({shares[1]:.2%}); "
        f"{per_change:,.0f} µs ({shares[2]:.2%})",
        f"each ≤ {GOAL:.0%}",
        max(shares) <= GOAL,
    )


def _us(phases: list[float]) -> str:
    return ", ".join(f"{seconds * 1e6:,.1f}" for seconds in phases) + " µs"


def run(sizes: Sizes, report: Report) -> None:
    connections = 50 if report.quick else 1000
    subscribers_n = 50 if report.quick else 1000
    rounds, seconds, changes = (2, 0.5, 5) if report.quick else (10, 2.0, 20)
    say(
        f"\n== metrics: heartbeats ({connections:,} connections) and fan-out ({subscribers_n:,} "
        "subscribers), metrics on and off side by side =="
    )
    flush(raw_client())
    beaters = make_users(HEARTBEAT_BASE_ID, connections, "metricsbeat")
    users = make_users(FANOUT_BASE_ID, subscribers_n + 1, "metricsfan")
    Contact.objects.bulk_create(
        [Contact(owner_id=users[0].pk, contact_id=v.pk) for v in users[1:]],
        batch_size=1000,
        ignore_conflicts=True,
    )
    with override_settings(PRESENCE=PRESENCE):
        run_async(main(report, beaters, users, rounds, seconds, changes))
    flush(raw_client())
