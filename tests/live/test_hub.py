"""presence.live: the hub between connections and the channel layer, announcements, and
lifecycle.asweep (what turns users offline by themselves). Real channels_redis layer, real Redis."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
import time_machine
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.test import override_settings

from presence import announce, lifecycle
from presence.announce import group_name
from presence.conf import get_settings
from presence.domain import Device
from presence.hub import Hub
from presence.models import LastSeen, UserStatus
from presence.signals import presence_changed
from presence.store import get_store
from tests.clock import at
from tests.conftest import on_one_redis, on_the_core_layer
from tests.ids import redis_member, wire_id
from tests.live.sockets import (
    BASE,
    HIDDEN,
    UNKNOWN_ID,
    Sockets,
    announced_about,
    assert_silent,
    connections_in_redis,
    diff,
    eventually,
    heartbeat,
    lets_see,
    new_user,
    online,
    open_sockets,
    presence,
    presence_settings,
    receive,
    state,
    subscribe,
)
from tests.loop_clock import at_phase, tick_after
from tools.redis_server import free_port

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]


def all_due(client: Any) -> list[tuple[str, float]]:
    """Every (user, due time) of the due schedules (one on one Redis, one per shard on a
    cluster)."""
    return [
        entry
        for due_key, _ in get_store().keys.schedules()
        for entry in client.zrange(due_key, 0, -1, withscores=True)
    ]


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    async for opened in open_sockets():
        yield opened


@pytest.fixture(autouse=True)
def _base_settings(settings: Any) -> None:
    settings.PRESENCE = dict(BASE)


def group_key(user_id: int) -> str:
    """channels_redis keeps a group as the sorted set "<layer prefix>:group:<name>"."""
    return f"{get_channel_layer().prefix}:group:{group_name(user_id)}"


def groups(client: redis.Redis) -> dict[str, list[str]]:
    """Every channel-layer group in Redis and its members."""
    prefix = f"{get_channel_layer().prefix}:group:"
    return {
        key.removeprefix(prefix): client.zrange(key, 0, -1)
        for key in sorted(client.scan_iter(prefix + "*"))
    }


def unreachable_presence_redis(settings: Any) -> override_settings:
    """Presence's Redis (the cache's) on a port nobody listens on; the channel layer's stays."""
    caches = {alias: dict(conf) for alias, conf in settings.CACHES.items()}
    caches["default"]["LOCATION"] = f"redis://127.0.0.1:{free_port()}/0"
    return override_settings(CACHES=caches)


# --- groups and tasks ---------------------------------------------------------------------------


@on_one_redis
@on_the_core_layer
async def test_the_hub_is_in_a_users_group_while_a_connection_subscribes_to_it(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
) -> None:
    first_viewer, second_viewer, a, b = [await new_user(make_user) for _ in range(4)]
    first = await sockets.open(first_viewer)
    second = await sockets.open(second_viewer)
    hub = Hub.current()
    assert hub is not None and hub.groups.channel is not None
    layer = get_channel_layer()
    # One channel of the hub's own for the whole process, named after the process.
    assert hub.groups.channel.startswith(f"specific.{layer.client_prefix}.hub")
    assert groups(redis_client) == {}

    assert await subscribe(first, a, b, UNKNOWN_ID) == state({a.pk: HIDDEN, b.pk: HIDDEN})
    assert (await receive(first))["code"] == "unknown_users"
    # Joined for a and b; an id of no user is left at once.
    assert groups(redis_client) == {
        group_name(a.pk): [hub.groups.channel],
        group_name(b.pk): [hub.groups.channel],
    }
    assert await subscribe(second, a) == state({a.pk: HIDDEN})
    assert redis_client.zrange(group_key(a.pk), 0, -1) == [hub.groups.channel]  # still one member

    await first.send_json_to({"type": "unsubscribe", "users": [wire_id(a)]})
    assert await subscribe(first) == state({})
    assert redis_client.zrange(group_key(a.pk), 0, -1) == [
        hub.groups.channel
    ]  # second still wants a
    await second.send_json_to({"type": "unsubscribe", "users": [wire_id(a)]})
    assert await subscribe(second) == state({})
    assert groups(redis_client) == {group_name(b.pk): [hub.groups.channel]}

    await sockets.close(first)  # its subscriptions go with it
    assert hub.registry.watchers.members == {}
    assert hub.registry.watchers.of == {}  # nor any connection's list of them
    # b's group lingers for the next page's socket (tests/live/test_group_linger.py), and is
    # left when the hub stops.
    assert groups(redis_client) == {group_name(b.pk): [hub.groups.channel]}
    await sockets.close(second)
    assert groups(redis_client) == {}


@on_one_redis
@on_the_core_layer
async def test_a_leave_and_a_join_of_one_group_reach_the_layer_in_order(
    sockets: Sockets, make_user: Callable[..., Any], redis_client: redis.Redis
) -> None:
    # The last watcher of a leaves while another connection subscribes to a: the hub leaves
    # and joins a's group in that order, so it stays in the group (the other order would
    # leave it deaf to a while a is watched).
    first_viewer, second_viewer, a = [await new_user(make_user) for _ in range(3)]
    first = await sockets.open(first_viewer)
    second = await sockets.open(second_viewer)
    hub = Hub.current()
    assert hub is not None
    assert (await subscribe(first, a))["type"] == "presence_state"
    for _ in range(20):
        leaving, joining = (
            hub.unwatch(*_watching(hub, a.pk)),
            hub.watch(_connection_of(hub, second_viewer.pk), [a.pk]),
        )
        await asyncio.gather(leaving, joining)
        assert redis_client.zrange(group_key(a.pk), 0, -1) == [hub.groups.channel]
        leaving, joining = (
            hub.unwatch(_connection_of(hub, second_viewer.pk), [a.pk]),
            hub.watch(_connection_of(hub, first_viewer.pk), [a.pk]),
        )
        await asyncio.gather(leaving, joining)
        assert redis_client.zrange(group_key(a.pk), 0, -1) == [hub.groups.channel]
    await sockets.close(first)
    await sockets.close(second)
    assert groups(redis_client) == {}


@on_one_redis
@on_the_core_layer
async def test_sockets_closing_together_leave_no_group_behind(
    sockets: Sockets, make_user: Callable[..., Any], redis_client: redis.Redis
) -> None:
    # Session-bound sockets of several users, each watching the others, all close at once:
    # the last one out stops the hub while the others still wait to leave their groups.
    from tests.live.sockets import _logged_in_client, _site_socket

    people = [await new_user(make_user) for _ in range(4)]
    opened = []
    for person in people:
        client = await sync_to_async(_logged_in_client)(person)
        socket = await _site_socket(sockets, client)
        assert (await subscribe(socket, *[p for p in people if p != person]))["type"] == (
            "presence_state"
        )
        opened.append(socket)
    hub = Hub.current()
    assert hub is not None and len(hub.registry.accounts.members) == len(people)
    assert len(groups(redis_client)) == 2 * len(people)  # each user's group and account group
    await asyncio.gather(*(sockets.close(socket) for socket in opened))
    assert hub.tasks.running == []
    assert groups(redis_client) == {}


@on_the_core_layer
async def test_a_watch_returns_only_once_the_process_is_in_the_group(
    sockets: Sockets,
    make_user: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two connections subscribe to a at once: the second must not read its snapshot before
    # the first one's join reaches the layer, or a change announced in between is unheard.
    first_viewer, second_viewer, a = [await new_user(make_user) for _ in range(3)]
    await sockets.open(first_viewer)
    await sockets.open(second_viewer)
    hub = Hub.current()
    assert hub is not None
    layer = get_channel_layer()
    joined = asyncio.Event()
    real_group_add = layer.group_add

    async def slow_group_add(group: str, channel: str) -> None:
        await joined.wait()
        await real_group_add(group, channel)

    monkeypatch.setattr(layer, "group_add", slow_group_add)
    first_watch = asyncio.ensure_future(hub.watch(_connection_of(hub, first_viewer.pk), [a.pk]))
    second_watch = asyncio.ensure_future(hub.watch(_connection_of(hub, second_viewer.pk), [a.pk]))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not first_watch.done() and not second_watch.done()
    joined.set()
    await asyncio.wait_for(asyncio.gather(first_watch, second_watch), 5)
    assert hub.registry.watchers.members[a.pk] == {
        _connection_of(hub, first_viewer.pk),
        _connection_of(hub, second_viewer.pk),
    }


@on_one_redis
@on_the_core_layer
async def test_a_leave_the_layer_refused_is_tried_again_unless_wanted_again(
    sockets: Sockets,
    make_user: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    redis_client: redis.Redis,
) -> None:
    with presence_settings(SWEEP_INTERVAL=0.1):
        viewer, wanted_again, left = [await new_user(make_user) for _ in range(3)]
        watcher = await sockets.open(viewer)
        assert await subscribe(watcher, wanted_again, left) == state(
            {wanted_again.pk: HIDDEN, left.pk: HIDDEN}
        )
        hub = Hub.current()
        assert hub is not None
        layer = get_channel_layer()
        real_group_discard = layer.group_discard
        refusing = True

        async def refused_while_down(group: str, channel: str) -> None:
            if refusing:
                raise ConnectionError("the layer's Redis is down")
            await real_group_discard(group, channel)

        monkeypatch.setattr(layer, "group_discard", refused_while_down)
        await watcher.send_json_to(
            {"type": "unsubscribe", "users": [wire_id(wanted_again), wire_id(left)]}
        )
        assert await subscribe(watcher) == state({})
        # Both leaves were refused; one user is subscribed to again before the layer is back.
        assert await subscribe(watcher, wanted_again) == state({wanted_again.pk: HIDDEN})
        refusing = False

        async def left_only() -> bool:
            return redis_client.zrange(group_key(left.pk), 0, -1) == []

        assert await eventually(left_only)
        for _ in range(3):  # a few sweeps later, the wanted group is still joined
            await asyncio.sleep(0.1)
            assert redis_client.zrange(group_key(wanted_again.pk), 0, -1) == [hub.groups.channel]


def _connection_of(hub: Hub, viewer_pk: Any) -> Any:
    return next(c for c in hub.registry.connections if c.viewer_id == viewer_pk)


def _watching(hub: Hub, user_pk: Any) -> tuple[Any, list[Any]]:
    (connection,) = hub.registry.watchers.members[user_pk]
    return connection, [user_pk]


@on_the_core_layer
async def test_the_hub_stops_its_tasks_when_the_last_connection_leaves(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    one, two = await new_user(make_user), await new_user(make_user)
    layer = get_channel_layer()
    first = await sockets.open(one)
    hub = Hub.current()
    assert hub is not None
    tasks, channel = list(hub.tasks.running), hub.groups.channel
    assert len(tasks) == 3  # deliver, sweep, receive
    assert not any(task.done() for task in tasks)
    second = await sockets.open(two)
    assert Hub.current() is hub and hub.tasks.running == tasks  # one hub per event loop

    await sockets.close(first)
    assert hub.tasks.running == tasks and not any(task.done() for task in tasks)
    await sockets.close(second)
    assert (
        hub.tasks.running == [] and hub.groups.channel is None and hub.registry.connections == set()
    )
    # Cancelled; a channel-layer receive may take up to its BZPOPMIN timeout (5 s) to end
    # (more on a busy machine: the wait ends as soon as they have).
    assert await eventually(lambda: all(task.done() for task in tasks), timeout=15)
    assert layer.receive_count == 0  # nothing waits on the channel layer's Redis any more

    # A new connection starts them again, on a new channel.
    third = await sockets.open(one)
    assert len(hub.tasks.running) == 3 and hub.groups.channel not in (None, channel)
    await sockets.close(third)
    assert hub.tasks.running == []


async def test_a_stopped_hub_sweeps_on_until_its_users_are_offline(
    sockets: Sockets, make_user: Callable[..., Any], redis_client: Any
) -> None:
    # The last connection of the process (and of the site) closes: nobody else would sweep
    # the user offline and out of the due schedule, so the stopped hub goes on sweeping for
    # CONNECTION_TTL + OFFLINE_GRACE, then ends.
    with presence_settings(SWEEP_INTERVAL=0.1, OFFLINE_GRACE=1, CONNECTION_TTL=2):
        user = await new_user(make_user)
        socket = await sockets.open(user)
        hub = Hub.current()
        assert hub is not None
        assert [who for who, _ in all_due(redis_client)] == [redis_member(user)]
        await sockets.close(socket)
        assert hub.tasks.running == [] and hub.tasks.lingering is not None
        # (bounds generous for a busy machine: each wait ends once it holds)
        assert await eventually(lambda: all_due(redis_client) == [], timeout=10)
        assert await eventually(
            lambda: hub.tasks.lingering is not None and hub.tasks.lingering.done(), 15
        )


# --- Redis outages ------------------------------------------------------------------------------


@on_one_redis
async def test_a_redis_outage_during_delivery_sends_nothing_wrong_and_catches_up(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with presence_settings(RETRY_INTERVAL=0.2):
        viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, viewer)
        watcher = await sockets.open(viewer)
        await sockets.open(target)
        assert await subscribe(watcher, target) == state({target.pk: online()})
        caplog.set_level(logging.WARNING, logger="presence")

        with unreachable_presence_redis(settings):
            # The target chooses dnd (saved without signals); the news travels over the
            # channel layer, whose Redis is fine, but the hub cannot read the live state.
            await sync_to_async(UserStatus.objects.bulk_create)([UserStatus(user=target, dnd=True)])
            await announce.aannounce([target.pk])
            # Several retries fail meanwhile; nothing is guessed (such as "offline").
            await assert_silent(watcher, seconds=0.8)
        messages = [r.getMessage() for r in caplog.records]
        assert [m[:32] for m in messages] == ["Presence: Redis is unavailable ("], messages
        # Redis answers again: the change is delivered, once.
        assert await receive(watcher) == diff(
            {target.pk: presence("dnd", at(0).isoformat(), ["web"])}
        )
        await assert_silent(watcher)


async def test_a_database_failure_during_delivery_is_retried_and_catches_up(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The database fails under the hub (a terminated connection, a failover): the change is
    # not dropped but delivered once the database answers again.
    from django.db import OperationalError

    from presence import relations

    failures = []
    load_pairs = relations.aload_pairs

    async def failing_once(*args: Any) -> Any:
        if not failures:
            failures.append(args)
            raise OperationalError("terminating connection due to administrator command")
        return await load_pairs(*args)

    with presence_settings(RETRY_INTERVAL=0.2):
        viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, viewer)
        watcher = await sockets.open(viewer)
        await sockets.open(target)
        assert await subscribe(watcher, target) == state({target.pk: online()})
        caplog.set_level(logging.ERROR, logger="presence")
        monkeypatch.setattr(relations, "aload_pairs", failing_once)
        await sync_to_async(UserStatus.objects.bulk_create)([UserStatus(user=target, dnd=True)])
        await announce.aannounce([target.pk])
        assert await receive(watcher) == diff(
            {target.pk: presence("dnd", at(0).isoformat(), ["web"])}
        )
        await assert_silent(watcher)
    assert len(failures) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "Presence: delivering live updates failed; retrying shortly"
    ]


async def test_views_are_resolved_again_when_an_outage_of_redis_ends(
    sockets: Sockets, make_user: Callable[..., Any], private_redis: Any
) -> None:
    # Redis restarts empty: the target's connection is gone, and nothing announced it. When
    # the outage ends, the hub resolves its users again and the viewer is told.
    with presence_settings(SWEEP_INTERVAL=0.1, RETRY_INTERVAL=0.2):
        viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, viewer)
        await lifecycle.aconnect(target, "c1")
        watcher = await sockets.open(viewer)
        subscribed = await subscribe(watcher, target)
        assert subscribed["presences"][str(target.pk)]["status"] == "online"
        private_redis.stop()
        assert await eventually(lambda: get_store().health.in_outage)
        private_redis.start()
        frame = await receive(watcher)
        assert frame["type"] == "presence_diff"
        assert frame["presences"][str(target.pk)]["status"] == "offline"
        assert get_store().health.recoveries >= 1
        await assert_silent(watcher)


@on_one_redis
async def test_a_snapshot_read_during_an_outage_is_corrected_when_redis_answers(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    settings: Any,
) -> None:
    with presence_settings(RETRY_INTERVAL=0.2):
        viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, viewer)
        watcher = await sockets.open(viewer)
        await sockets.open(target)
        with unreachable_presence_redis(settings):
            # Only the database can be asked: offline, for want of knowing better...
            assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
            await assert_silent(watcher, seconds=0.5)
        # ... and the truth follows once Redis answers, though the target changed nothing.
        assert await receive(watcher) == diff({target.pk: online()})
        await assert_silent(watcher)


# --- coalescing and announcements ---------------------------------------------------------------


async def test_each_change_comes_at_the_first_tick_after_it(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # Long enough that opening a socket, or a socket and a heartbeat, fit in a third of it on
    # a machine saturated by other work (0.6 s did not: 0.63 s seen in a loaded cluster run).
    window = 2.0
    with presence_settings(COALESCE_WINDOW=window):
        viewer, a, b = [await new_user(make_user) for _ in range(3)]
        await lets_see(a, viewer)
        await lets_see(b, viewer)
        watcher = await sockets.open(viewer)
        assert await subscribe(watcher, a, b) == state({a.pk: HIDDEN, b.pk: HIDDEN})
        loop = asyncio.get_running_loop()
        await at_phase(0.05, window)
        tick = tick_after(loop.time(), window)
        tab_a = await sockets.open(a)
        assert loop.time() < tick - window / 2, "too slow to test this"
        # a's diff at the first tick after its change, with nothing of b's in it...
        assert await receive(watcher) == diff({a.pk: online()})
        assert tick <= loop.time() < tick + window / 3
        tab_b = await sockets.open(b)  # b changes after that tick...
        await heartbeat(tab_b, "idle")  # ... and changes again
        assert loop.time() < tick + window * 2 / 3, "too slow to test this"
        # ... so b's comes at the next tick, with its final state.
        assert await receive(watcher) == diff({b.pk: presence("idle", at(0).isoformat(), ["web"])})
        assert loop.time() >= tick + window
        await assert_silent(watcher, tab_a, tab_b)


async def test_a_change_is_due_at_the_next_tick_whatever_its_announcements_time(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    window = 60.0
    with presence_settings(COALESCE_WINDOW=window):
        viewer = await new_user(make_user)
        slow, ahead, stale, unstamped = [await new_user(make_user) for _ in range(4)]
        watcher = await sockets.open(viewer)
        await subscribe(watcher, slow, ahead, stale, unstamped)
        hub = Hub.current()
        assert hub is not None
        now = asyncio.get_running_loop().time()

        def arrives(user: Any, **stamp: Any) -> None:
            assert hub is not None
            hub.dispatch({"type": announce.CHANGED, "users": [wire_id(user)], **stamp})

        # Announced 45 s ago (the message was slow to arrive), from a host whose clock is
        # ahead, long ago, or without a time (a message of an older version): each at the
        # grid's next tick, never later than a window after it arrived, nor sooner than the
        # tick (a late one is not delivered at once: every viewer's diffs come at ticks).
        arrives(slow, at=time.time() - 45)
        arrives(ahead, at=time.time() + 100)
        arrives(stale, at=time.time() - 1000)
        arrives(unstamped)
        tick = tick_after(now, window)
        assert {uid: at for uid, at in hub.delivery.pending.items()} == {
            slow.pk: tick,
            ahead.pk: tick,
            stale.pk: tick,
            unstamped.pk: tick,
        }


async def _unannounced_change(
    sockets: Sockets, make_user: Callable[..., Any]
) -> tuple[Any, Hub, Any]:
    """A viewer watching a target it may see, then the target coming online without an
    announcement (one the layer dropped): (the viewer's socket, the hub, the target)."""
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
    hub = Hub.current()
    assert hub is not None and not hub.recovery.behind
    store = get_store()
    await store.arun(store.plans.touch(target.pk, Device.WEB, time.time()))
    return watcher, hub, target


async def test_a_process_behind_its_channel_resolves_every_view_again_once_caught_up(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # An overloaded process receives announcements later and later; past the layer's expiry
    # (or a full channel's capacity) they are dropped without a word. Once it has caught up,
    # every user it watches is resolved again, so views it missed a change of are corrected.
    with presence_settings(SWEEP_INTERVAL=0.1):
        watcher, hub, target = await _unannounced_change(sockets, make_user)
        # An announcement about someone else arrives as late as that: the process is behind.
        announced_about(hub, await new_user(make_user), time.time() - hub.behind_after())
        assert hub.recovery.behind
        # Once no late one came for a sweep interval, the target's view is corrected.
        assert await receive(watcher) == diff({target.pk: online()})
        assert not hub.recovery.behind
        await assert_silent(watcher)


async def test_announcements_on_time_resolve_nothing_more(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(SWEEP_INTERVAL=0.1):
        watcher, hub, _ = await _unannounced_change(sockets, make_user)
        # Late, but not that late.
        announced_about(hub, await new_user(make_user), time.time() - hub.behind_after() + 1)
        assert not hub.recovery.behind
        # A time that is not one (a message of another version, or garbage) says nothing.
        for sent in ("0", True, None, [0]):
            hub.dispatch({"type": announce.CHANGED, "users": [], "sent": sent})
        assert not hub.recovery.behind
        # Nothing announced the target's change: no sweep resolves it anew by itself.
        await assert_silent(watcher, seconds=0.5)


async def test_a_change_is_announced_as_made_when_its_frame_or_request_arrived(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    window = 60.0
    with presence_settings(COALESCE_WINDOW=window):
        viewer, from_async, from_sync, plain = [await new_user(make_user) for _ in range(4)]
        watcher = await sockets.open(viewer)
        await subscribe(watcher, from_async, from_sync, plain)
        hub = Hub.current()
        assert hub is not None
        # The time each change reached the hub's delivery as made at (the grid's tick hides
        # it: a change is delivered at the next one, however long it took to arrive).
        made_at: dict[Any, float | None] = {}
        delivery_changed = hub.delivery.changed

        def changed(user_ids: Any, announced_at: float | None = None, *rest: Any) -> None:
            user_ids = list(user_ids)
            made_at.update(dict.fromkeys(user_ids, announced_at))
            delivery_changed(user_ids, announced_at, *rest)

        monkeypatch.setattr(hub.delivery, "changed", changed)
        # The frame that made these changes arrived 20 s ago (handling it took that long).
        with announce.change_started_at(time.time() - 20):
            await announce.aannounce([from_async.pk])
            # Sync code (a signal receiver in sync_to_async's thread) announces the same.
            await sync_to_async(announce.announce)([from_sync.pk])
        await announce.aannounce([plain.pk])  # outside: made now

        async def all_pending() -> bool:
            return {from_async.pk, from_sync.pk, plain.pk} <= set(hub.delivery.pending)

        assert await eventually(all_pending)
        # (The clock is frozen.)
        assert made_at == {
            from_async.pk: time.time() - 20,
            from_sync.pk: time.time() - 20,
            plain.pk: time.time(),
        }


async def test_a_socket_reading_a_snapshot_holds_up_no_one_elses_diff(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # Long enough that the target's socket opens well within it on a saturated machine.
    window = 2.0
    with presence_settings(COALESCE_WINDOW=window):
        viewer, reloading_viewer, target = [await new_user(make_user) for _ in range(3)]
        await lets_see(target, viewer)
        await lets_see(target, reloading_viewer)
        watcher = await sockets.open(viewer)
        reloading = await sockets.open(reloading_viewer)
        assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
        assert await subscribe(reloading, target) == state({target.pk: HIDDEN})
        hub = Hub.current()
        assert hub is not None
        # The second socket is (as far as the hub can tell) reading a snapshot of the target
        # when the target's window ends.
        reader = _connection_of(hub, reloading_viewer.pk)
        reader.snapshotting.add(target.pk)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await sockets.open(target)
        assert await receive(watcher) == diff({target.pk: online()})
        assert loop.time() - started < 2 * window  # one window, not one more after the read
        await assert_silent(reloading)
        # Its read over, the reading socket is delivered to as well.
        reader.snapshotting.discard(target.pk)
        assert await receive(reloading) == diff({target.pk: online()})
        await assert_silent(watcher)


async def test_announce_from_sync_code_reaches_a_connected_viewer(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})

    # A change made behind presence's back (no signal) reaches nobody...
    await sync_to_async(UserStatus.objects.bulk_create)([UserStatus(user=target, dnd=True)])
    await assert_silent(watcher)
    # ... until sync code (a view, a signal receiver, a thread) announces it.
    await asyncio.to_thread(announce.announce, [target.pk])
    assert await receive(watcher) == diff({target.pk: presence("dnd", at(0).isoformat(), ["web"])})

    await sync_to_async(UserStatus.objects.filter(user=target).update)(text="Back at 3")
    await sync_to_async(presence_changed.send)(
        sender=UserStatus, user_id=target.pk, reason="status"
    )
    assert await receive(watcher) == diff(
        {target.pk: presence("dnd", at(0).isoformat(), ["web"], "Back at 3")}
    )
    await assert_silent(watcher)


# --- sweeping -----------------------------------------------------------------------------------


@on_one_redis
async def test_racing_sweeps_claim_each_due_user_once_and_reschedule_the_online(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
) -> None:
    with presence_settings(CONNECTION_TTL=10, HEARTBEAT_INTERVAL=5, SWEEP_BATCH=2):
        viewer = await new_user(make_user)
        crashed = [await new_user(make_user) for _ in range(4)]
        still_on = await new_user(make_user)
        for user in (*crashed, still_on):
            await lets_see(user, viewer)
        watcher = await sockets.open(viewer)
        for user in crashed:
            await sockets.open(user)  # at T0, and never heard from again
        clock.shift(5)
        await heartbeat(watcher)
        await sockets.open(still_on)
        # One tab of two closes: due at +11 (the grace counts from the end of the second).
        await sockets.close(await sockets.open(still_on))
        assert await subscribe(watcher, *crashed, still_on) == state(
            {user.pk: online(0 if user in crashed else 5) for user in (*crashed, still_on)}
        )
        due = all_due(redis_client)
        t0 = at(0).timestamp()
        assert sorted(due) == sorted(
            [(str(u.pk), t0 + 11) for u in (*crashed, still_on)] + [(str(viewer.pk), t0 + 16)]
        )

        clock.shift(6)  # +11: the four crashed and the closed tab are due; batches of 2
        first, second = await asyncio.gather(lifecycle.asweep(), lifecycle.asweep())
        third, fourth = await lifecycle.asweep(), await lifecycle.asweep()
        claims = [len(r.offline) + r.rescheduled for r in (first, second, third, fourth)]
        assert claims == [2, 2, 1, 0]  # both racers got work, nobody got a user twice
        offline = first.offline + second.offline + third.offline
        assert sorted(offline) == sorted(u.pk for u in crashed)
        assert first.rescheduled + second.rescheduled + third.rescheduled == 1
        # The one still online is checked again when its open tab's heartbeat runs out.
        assert sorted(all_due(redis_client)) == sorted(
            [(str(still_on.pk), t0 + 5 + 1 + 10), (str(viewer.pk), t0 + 16)]
        )
        # Each crashed user is announced offline once, with last seen at its only heartbeat.
        told: dict[str, Any] = {}
        while len(told) < len(crashed):
            frame = await receive(watcher)
            assert frame["type"] == "presence_diff"
            assert not set(frame["presences"]) & set(told), frame
            told |= frame["presences"]
        assert told == {str(u.pk): presence("offline", at(0).isoformat()) for u in crashed}
        await assert_silent(watcher)
        rows = await sync_to_async(lambda: dict(LastSeen.objects.values_list("user", "seen_at")))()
        assert rows == {u.pk: at(0) for u in crashed}


async def test_the_hub_sweeps_by_itself(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # Set before the first connection: the hub's sweep loop reads the interval as it sleeps.
    with presence_settings(SWEEP_INTERVAL=0.05):
        viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, viewer)
        watcher = await sockets.open(viewer)
        await sockets.open(target)
        assert await subscribe(watcher, target) == state({target.pk: online()})
        clock.shift(get_settings().CONNECTION_TTL + 1)  # every connection fell silent
        assert await receive(watcher) == diff({target.pk: presence("offline", at(0).isoformat())})
        await assert_silent(watcher)


async def test_a_connection_closes_at_once_whenever_the_hub_stops(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    """The last connection's close stops the hub, whose channel-layer receive is then
    cancelled wherever it is (channels_redis with redis-py sometimes swallows that cancellation
    and blocks until its BZPOPMIN times out). Neither that close nor the next connection may
    wait for it."""
    user = await new_user(make_user)
    loop = asyncio.get_running_loop()
    for cycle, delay in enumerate([0, 0.0005, 0.001, 0.002, 0.003, 0.005] * 3):
        communicator = await sockets.open(user)
        await asyncio.sleep(delay)
        started = loop.time()
        await sockets.close(communicator)
        assert not communicator.future.cancelled(), f"close {cycle} did not end by itself"
        # Waiting for the receive's BZPOPMIN (5 s, from the opening) would take about 4.5 s or
        # more; 3 s leaves room for a busy machine.
        assert loop.time() - started < 3, f"close {cycle} took {loop.time() - started:.1f} s"
        assert await connections_in_redis(user) == []  # the close was recorded
