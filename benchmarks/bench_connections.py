"""connections: memory per idle open connection at 5,000 connections on one process.

Each side runs in a fresh Python process (``python -c`` with Django set up on the benchmark's
database), so that memory freed by one side cannot be reused by the other: first a few warm-up
connections (imports, the hub and its tasks, the Redis and channel-layer clients, the database
connection), then RSS (``/proc/self/statm``) and the number of objects tracked by the garbage
collector are read after ``gc.collect()``; N connections are opened (``WebsocketCommunicator``,
10 at a time), each for its own user and subscribed to 5 others (connection i to users
i+1..i+5, so each user is watched by 5 connections and 5 diffs "online" arrive per connection
as the others connect, who let it see them: they are read and dropped); every connection sends a
heartbeat every HEARTBEAT_INTERVAL as presence.js does; once every frame is delivered and read,
RSS and objects again. Per connection = growth / N. The communicators' own queues and tasks count
on both sides alike.

Once every user is connected, each subscription should show its user online: the presence
child counts those still showing offline (a diff never sent), and the group messages
channels_redis dropped because the hub's channel already held its capacity (100 by default;
logged at INFO level only).

Side by side, the same harness on a bare ``AsyncWebsocketConsumer`` (accept; answer each
subscribe with an empty presence_state; no channel layer, no Redis, no database).

Redis memory per connected user, read in the presence child while its connections are open:
the growth of ``used_memory`` / N, and ``MEMORY USAGE`` of the keys by kind (seen buckets,
conns hashes, the due schedule, channel-layer groups), divided by the users in them. With 5,000
users spread over 16,384 buckets nearly every user has a bucket key of each kind to itself, so
the key overhead dominates here (the ``memory`` benchmark measures the buckets at 1,000,000).

Then, in this process, one connection subscribes to 1,000 users (MAX_SUBSCRIPTIONS) in one frame
while no other connection of the process watches them: the hub joins their channel-layer groups
concurrently (one ``group_add`` each, ``asyncio.gather``), and the number of groups that exist
in Redis afterwards is compared with the number of users watched; users of groups not joined
are then brought online, to see whether their diffs arrive.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import redis
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.urls import path

from benchmarks.bench_fanout import (
    bounded,
    close_all,
    counting_warnings,
    make_users,
    rss_bytes,
    run_async,
)
from benchmarks.common import Report, Sizes, flush, raw_client, say, scan_keys
from presence import lifecycle
from presence.conf import get_settings
from presence.hub import Hub
from presence.models import Contact
from presence.routing import websocket_urlpatterns
from presence.store import get_store

NAME = "connections"
BASE_ID = 22_000_000
WARM = 20
SUBSCRIPTIONS = 5
OURS, BARE = "ours", "bare"
#: ours on channels_redis's pub/sub layer (RedisPubSubChannelLayer) instead of the core one
PUBSUB = "ours-pubsub"
#: ours on the core layer with the layer's Redis keeping groups compact: a group's member (a
#: channel name, "specific.<32 hex>!<32 hex>") is 74 bytes, over zset-max-listpack-value (64)
COMPACT = "ours-compact"
#: ours on the core layer with users as dense in the buckets as on a site with a million online
#: (about 61 per bucket): the per-bucket key overhead shared as it is at scale
DENSE = "ours-dense"
OURS_VARIANTS = (OURS, DENSE, PUBSUB, COMPACT)
#: users per bucket at 1,000,000 online over the default 16,384 buckets
SITE_DENSITY = 61
CHANNEL_PREFIX = "asgi"


class BareConsumer(AsyncWebsocketConsumer):
    """The baseline: accepts, answers each subscribe with an empty snapshot."""

    channel_layer_alias = "presence.hub-only"

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if '"subscribe"' in (text_data or ""):
            await self.send(text_data='{"type":"presence_state","presences":{}}')


class KeepAlive:
    """Sends each open connection a heartbeat every HEARTBEAT_INTERVAL, as presence.js does
    (an idle page keeps beating; without it the store drops a connection after
    CONNECTION_TTL, and opening 5,000 takes longer than that)."""

    def __init__(self) -> None:
        self.interval = get_settings().HEARTBEAT_INTERVAL
        self.due: list[tuple[float, WebsocketCommunicator]] = []
        self.task = asyncio.ensure_future(self.run())

    def add(self, comm: WebsocketCommunicator) -> None:
        self.due.append((time.monotonic() + self.interval, comm))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(1)
            now, later, sent = time.monotonic(), [], 0
            for at, comm in self.due:
                if at <= now:
                    await comm.send_json_to({"type": "heartbeat", "state": "active"})
                    at = now + self.interval
                    sent += 1
                    if sent % 20 == 0:
                        # Spread like real clients: at most ~400/s, not all due ones at once
                        # (more than 100 in flight exhaust the store's pool: see heartbeats).
                        await asyncio.sleep(0.05)
                later.append((at, comm))
            self.due = later


def application(variant: str) -> Any:
    if variant in OURS_VARIANTS:
        return URLRouter(websocket_urlpatterns)
    return URLRouter([path("ws/presence/", BareConsumer.as_asgi())])


async def open_connection(
    app: Any, user_id: int, subscribe: list[int], keepalive: KeepAlive | None = None
) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(app, "/ws/presence/")
    comm.scope["user"] = get_user_model()(id=user_id, username=f"conn{user_id}")
    connected, _ = await comm.connect(timeout=60)
    if not connected:
        raise RuntimeError("a connection was refused")
    await comm.send_json_to({"type": "subscribe", "users": subscribe})
    state = await comm.receive_json_from(timeout=60)
    if state.get("type") != "presence_state":
        raise RuntimeError(f"unexpected answer to subscribe: {state}")
    #: the status this connection was last told for each of its users
    comm.view = {uid: p["status"] for uid, p in state["presences"].items()}  # type: ignore[attr-defined]
    if keepalive is not None:
        keepalive.add(comm)
    return comm


async def open_ring(
    app: Any, first: int, count: int, keepalive: KeepAlive
) -> list[WebsocketCommunicator]:
    """``count`` connections of users first..first+count-1, each subscribed to the next 5."""

    def targets(i: int) -> list[int]:
        return [first + (i + k) % count for k in range(1, SUBSCRIPTIONS + 1)]

    return await bounded(
        [partial(open_connection, app, first + i, targets(i), keepalive) for i in range(count)],
        10,
    )


async def settle(comms: list[WebsocketCommunicator], quiet: float = 1.0) -> int:
    """Wait until no frame has arrived for a while (past the coalescing window), reading what
    arrived (diffs update the connection's view); returns the number of frames read."""
    quiet_for = get_settings().COALESCE_WINDOW + quiet
    frames = 0
    last = time.perf_counter()
    while time.perf_counter() - last < quiet_for:
        await asyncio.sleep(0.1)
        for comm in comms:
            queue = comm.output_queue
            while not queue.empty():
                text = queue.get_nowait().get("text") or ""
                if '"presence_diff"' in text:
                    for uid, presence in json.loads(text)["presences"].items():
                        comm.view[uid] = presence["status"]  # type: ignore[attr-defined]
                frames += 1
                last = time.perf_counter()
    return frames


class OverCapacity(logging.Handler):
    """channels_redis drops a group message for a channel holding ``capacity`` (100) messages
    already, and only says so at INFO level."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "over capacity" in record.getMessage():
            self.dropped += 1


def memory_usage(client: redis.Redis, pattern: str) -> tuple[int, int]:
    """(keys, sum of MEMORY USAGE) of the keys matching ``pattern``."""
    keys = scan_keys(client, pattern)
    total = 0
    for start in range(0, len(keys), 1000):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + 1000]:
            pipe.execute_command("MEMORY USAGE", key, "SAMPLES", 0)
        total += sum(int(r or 0) for r in pipe.execute())
    return len(keys), total


def used_memory(client: redis.Redis) -> int:
    info: dict[str, Any] = client.info("memory")
    return int(info["used_memory"])


async def child(variant: str, count: int, quiet: float = 1.0) -> dict[str, Any]:
    dropped = OverCapacity()
    channels_logger = logging.getLogger("channels_redis.core")
    channels_logger.addHandler(dropped)
    channels_logger.setLevel(logging.INFO)
    app = application(variant)
    client = raw_client()
    keepalive = KeepAlive()
    warm = await open_ring(app, BASE_ID + count, WARM, keepalive)
    await settle(warm, quiet)
    gc.collect()
    rss_before, objects_before = rss_bytes(), len(gc.get_objects())
    redis_before = used_memory(client)
    started = time.perf_counter()
    comms = await open_ring(app, BASE_ID, count, keepalive)
    opened = time.perf_counter() - started
    frames = await settle(comms, quiet)
    gc.collect()
    result: dict[str, Any] = {
        "rss": rss_bytes() - rss_before,
        "objects": len(gc.get_objects()) - objects_before,
        "rss_total": rss_bytes(),
        "open_seconds": opened,
        "frames_after_open": frames,
    }
    if variant in OURS_VARIANTS:
        prefix = get_store().conf.KEY_PREFIX
        result["redis_used"] = used_memory(client) - redis_before
        result["redis_keys"] = {
            kind: memory_usage(client, pattern)
            for kind, pattern in (
                ("seen buckets", f"{prefix}:*:seen"),
                ("conns hashes", f"{prefix}:*:conns"),
                ("expiries", f"{prefix}:*:expiries"),
                ("due schedule", f"{prefix}:{{live}}:due"),
                ("channel-layer groups", f"{CHANNEL_PREFIX}:group:*"),
            )
        }
        hub = Hub.current()
        result["watched"] = len(hub.registry.watchers.members) if hub else 0
        # Every user is connected now: each subscription should show it online.
        views = [status for comm in comms for status in comm.view.values()]  # type: ignore[attr-defined]
        result["subscriptions"] = len(views)
        result["stale"] = sum(status != "online" for status in views)
        result["dropped"] = dropped.dropped
    client.close()
    return result


def child_main(argv: list[str]) -> int:
    """Entry point of a child process (Django is set up by the caller)."""
    from django.test import override_settings

    variant, count = argv[0], int(argv[1])
    presence: dict[str, Any] = {}
    if variant != OURS and variant in OURS_VARIANTS:
        # As dense as a site with a million online: the buckets' key overhead is shared.
        presence["BUCKETS"] = max(1, (count + WARM) // SITE_DENSITY)
    with override_settings(PRESENCE=presence):
        result = run_async(child(variant, count, float(argv[2])))
    print("RESULT " + json.dumps(result), flush=True)
    # Skip closing thousands of connections: the parent flushes Redis.
    os._exit(0)


def run_child(variant: str, count: int, quiet: float) -> dict[str, Any]:
    code = (
        "import sys, django; django.setup(); "
        "from benchmarks.bench_connections import child_main; child_main(sys.argv[1:])"
    )
    env = dict(os.environ)
    if variant == PUBSUB:
        env["PRESENCE_TEST_LAYER"] = "pubsub"  # tests/settings/base.py: the pub/sub layer
    done = subprocess.run(
        [sys.executable, "-c", code, variant, str(count), str(quiet)],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        timeout=1800,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the {variant} child failed ({done.returncode}): {done.stdout[-2000:]}")
    return dict(json.loads(lines[-1].removeprefix("RESULT ")))


async def subscribe_burst(
    viewer_id: int, targets: list[int], client: redis.Redis, quick: bool
) -> tuple[int, int, int, int]:
    """One connection subscribes to all ``targets`` at once. Returns (users watched, groups in
    Redis, diffs received, users brought online) for users whose groups are missing."""
    app = application(OURS)
    comm = await open_connection(app, viewer_id, targets)
    # The hub's group_add calls that did not fail may still be under way: let them finish.
    await asyncio.sleep(0.5 if quick else 2)
    hub = Hub.current()
    watched = len(hub.registry.watchers.members) if hub else 0
    groups = {
        key.decode().rsplit(".", 1)[-1] for key in scan_keys(client, f"{CHANNEL_PREFIX}:group:*")
    }
    missing = [uid for uid in targets if str(uid) not in groups][:10]
    # Users of missing groups come online: their diffs should arrive within the window.
    for uid in missing:
        await lifecycle.aheartbeat(uid, "burst", "web")
    await asyncio.sleep(get_settings().COALESCE_WINDOW + (0.3 if quick else 1.5))
    diffs = 0
    while not comm.output_queue.empty():
        message = comm.output_queue.get_nowait()
        if '"presence_diff"' in message.get("text", ""):
            diffs += len(json.loads(message["text"])["presences"])
    for uid in missing:
        await lifecycle.adisconnect(uid, "burst")
    await close_all([comm])
    await get_store().aclose()
    return watched, len(groups), diffs, len(missing)


def kb(value: float) -> str:
    return f"{value / 1024:,.1f} KB"


def run(sizes: Sizes, report: Report) -> None:
    count = 100 if report.quick else 5000
    burst = min(get_settings().MAX_SUBSCRIPTIONS, count)
    say(f"\n== connections: {count:,} idle open connections on one process ==")
    client = raw_client()
    flush(client)
    users = make_users(BASE_ID, count + WARM + 1, "conn")
    viewer_id = users[-1].pk
    # Each user lets the 5 connections that subscribe to it see it (contacts visibility), and
    # the burst's targets let the burst's viewer see them.
    contacts = [
        Contact(owner_id=first + (i + k) % size, contact_id=first + i)
        for first, size in ((BASE_ID, count), (BASE_ID + count, WARM))
        for i in range(size)
        for k in range(1, SUBSCRIPTIONS + 1)
    ]
    contacts += [
        Contact(owner_id=uid, contact_id=viewer_id) for uid in range(BASE_ID, BASE_ID + burst)
    ]
    Contact.objects.bulk_create(contacts, batch_size=1000, ignore_conflicts=True)
    results = {}
    for variant in (OURS, DENSE, PUBSUB, COMPACT, BARE):
        # zset-max-ziplist-value: Redis 7 calls it zset-max-listpack-value (both names work)
        listpack_value = next(iter(dict(client.config_get("zset-max-ziplist-value")).values()))
        if variant == COMPACT:
            client.config_set("zset-max-ziplist-value", 128)
        try:
            results[variant] = run_child(variant, count, 0.3 if report.quick else 1.0)
        finally:
            client.config_set("zset-max-ziplist-value", listpack_value)
        flush(client)
        r = results[variant]
        say(
            f"  {variant}: opened in {r['open_seconds']:.1f} s; RSS +{r['rss'] / 2**20:,.1f} MB "
            f"({kb(r['rss'] / count)} per connection; {r['rss_total'] / 2**20:,.0f} MB in all), "
            f"{r['objects'] / count:,.0f} gc-tracked objects per connection; "
            f"{r['frames_after_open']:,} frames read after the snapshots"
        )
    ours, bare = results[OURS], results[BARE]
    connected = count + WARM
    say(
        f"  ours: after opening, {ours['stale']:,} of {ours['subscriptions']:,} subscriptions "
        "still show their user offline although every user is online (diffs never sent: "
        f"channels_redis dropped {ours['dropped']:,} group messages to the hub's channel, "
        "over its capacity of 100)"
    )
    say(
        f"  Redis: used_memory +{ours['redis_used']:,} B for {count:,} users "
        f"({ours['redis_used'] / count:,.0f} B each; {ours['watched']:,} users watched by the hub)"
    )
    for kind, (keys, total) in ours["redis_keys"].items():
        say(
            f"    {kind:<22} {keys:>6,} keys, {total:>11,} B: {total / connected:>6,.0f} B per "
            "connected user"
        )

    with counting_warnings() as warnings:
        watched, groups, diffs, tried = run_async(
            subscribe_burst(viewer_id, list(range(BASE_ID, BASE_ID + burst)), client, report.quick)
        )
    say(
        f"  one subscribe of {burst:,} users: the hub watches {watched:,}, {groups:,} "
        f"channel-layer groups exist; of {tried} users of missing groups brought online, "
        f"{diffs} diffs arrived"
    )
    if warnings.total():
        warnings.show()
    flush(client)
    client.close()

    per_ours, per_bare = ours["rss"] / count, bare["rss"] / count
    report.add(NAME, "connections", f"{count:,} (+{WARM} warm-up)")
    report.add(
        NAME, "ours: RSS per idle connection", kb(per_ours), "≤ 50 KB", per_ours <= 50 * 1024
    )
    report.add(NAME, "bare consumer: RSS per connection", kb(per_bare))
    report.add(
        NAME,
        "ours/bare RSS per connection",
        f"{per_ours / per_bare:.1f}x (+{kb(per_ours - per_bare)})",
    )
    dense, pubsub, compact = results[DENSE], results[PUBSUB], results[COMPACT]
    say(
        f"  at a million-user site's density ({SITE_DENSITY} users per bucket, "
        f"{max(1, connected // SITE_DENSITY)} buckets):"
    )
    for variant in (DENSE, PUBSUB, COMPACT):
        for kind, (keys, total) in results[variant]["redis_keys"].items():
            say(f"    {variant}: {kind:<22} {keys:>6,} keys, {total / connected:>6,.0f} B per user")
    report.add(
        NAME,
        "Redis used_memory per connected user, 16,384 buckets (today's figure)",
        f"{ours['redis_used'] / count:,.0f} B",
    )
    report.add(
        NAME,
        f"Redis used_memory per connected user at {SITE_DENSITY} users per bucket: core layer / "
        "pub/sub layer / core with zset-max-listpack-value 128",
        f"{dense['redis_used'] / count:,.0f} B / {pubsub['redis_used'] / count:,.0f} B / "
        f"{compact['redis_used'] / count:,.0f} B",
        "≤ 500 B",
        min(pubsub["redis_used"], compact["redis_used"]) / count <= 500,
    )
    report.add(
        NAME,
        "pub/sub layer: RSS per idle connection, stale subscriptions",
        f"{kb(pubsub['rss'] / count)}, {pubsub['stale']:,} of {pubsub['subscriptions']:,}",
    )
    report.add(
        NAME,
        "ours: subscriptions left stale while opening",
        f"{ours['stale']:,} of {ours['subscriptions']:,} ({ours['dropped']:,} messages dropped)",
        "0",
        ours["stale"] == 0,
    )
    report.add(
        NAME,
        f"groups joined after subscribing to {burst:,} users at once",
        f"{groups:,} of {watched:,}",
        f"{watched:,}",
        groups == watched,
    )
