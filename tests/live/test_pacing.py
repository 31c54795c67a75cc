"""presence.hub.delivery: a resync (every watched user resolved again after an outage, a
channel-layer failure or lag) is paced below the live work, so that it does not feed the lag
it recovers from. The rule on its own with the times passed in (ResyncPace), then the delivery
loop's order with a recording delivery (no Redis needed: what is delivered, not how)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from presence import lifecycle
from presence.hub import Hub
from presence.hub.delivery import RESYNC_STARVED, Delivery, ResyncPace
from presence.hub.registry import Registry
from tests.live.sockets import (
    BASE,
    Sockets,
    assert_silent,
    lets_see,
    new_user,
    open_sockets,
    presence_settings,
    receive,
    subscribe,
)


def test_a_chunk_waits_so_that_the_resync_keeps_to_its_share() -> None:
    pace = ResyncPace(share=0.25, batch=10)
    pace.request(range(100))
    assert pace.may_run(0.0, live_due=False)
    assert pace.take(lambda uid: True) == list(range(10))
    pace.spent(started=0.0, ended=0.1)
    # 0.1 s of work is a quarter of 0.4 s: the next chunk waits until then.
    assert pace.wake_at() == pytest.approx(0.4)
    assert not pace.may_run(0.39, live_due=False)
    assert pace.may_run(0.4, live_due=False)
    assert pace.take(lambda uid: True) == list(range(10, 20))


def test_live_work_goes_first_unless_the_resync_was_starved_of_its_share() -> None:
    pace = ResyncPace(share=0.25, batch=10)
    pace.request(range(30))
    pace.spent(started=0.0, ended=0.1)
    assert not pace.may_run(0.5, live_due=True)
    assert pace.may_run(0.5, live_due=False)
    # Kept waiting by live work for RESYNC_STARVED past its turn: one chunk anyway.
    assert pace.may_run(0.4 + RESYNC_STARVED, live_due=True)


def test_a_chunk_skips_users_no_longer_watched_and_a_live_change_takes_a_user_out() -> None:
    pace = ResyncPace(share=0.5, batch=3)
    pace.request([1, 2, 3, 4, 5, 6])
    pace.discard(2)  # a live delivery of 2 is coming: it resolves 2 afresh anyway
    assert pace.take(lambda uid: uid != 3) == [1, 4, 5]
    assert pace.take(lambda uid: True) == [6]
    assert pace.wake_at() is None
    assert not pace.may_run(100.0, live_due=False)


class _Viewer:
    """A connection as the registry holds it (never sent to: the delivery is recorded)."""


@pytest.fixture
def _no_window(settings: Any) -> None:
    settings.PRESENCE = {**BASE, "COALESCE_WINDOW": 0}


@pytest.mark.usefixtures("_no_window")
async def test_a_live_change_is_delivered_before_the_rest_of_a_resync() -> None:
    registry = Registry()
    viewer = _Viewer()
    watched = list(range(1, 1001))
    for uid in watched:
        registry.watchers.add(viewer, uid)  # type: ignore[arg-type]
    delivery = Delivery(registry)
    calls: list[tuple[list[int], float, float]] = []
    first_chunk_running = asyncio.Event()

    async def deliver(user_ids: list[Any]) -> None:
        started = asyncio.get_running_loop().time()
        first_chunk_running.set()
        await asyncio.sleep(0.02)  # what resolving and sending takes
        calls.append((list(user_ids), started, asyncio.get_running_loop().time()))

    running = True
    loop_task = asyncio.ensure_future(delivery._rounds(deliver, lambda: running))
    try:
        delivery.resync(watched)
        await first_chunk_running.wait()
        # A change announced while the resync's first chunk is resolved.
        delivery.changed([777])
        while sum(len(ids) for ids, _, _ in calls) < len(watched):
            await asyncio.sleep(0.01)
    finally:
        running = False
        delivery._wake.set()
        await asyncio.wait_for(loop_task, 5)
    chunks = [ids for ids, _, _ in calls]
    # The live change right after the chunk it arrived during, not behind 800 more users.
    assert chunks[1] == [777]
    resync = [ids for ids in chunks if ids != [777]]
    assert all(len(ids) <= 200 for ids in resync)
    assert sorted(uid for ids in resync for uid in ids) == [uid for uid in watched if uid != 777]
    # Each chunk waited three times as long as the one before it took (a quarter of the time).
    times = [(started, ended) for ids, started, ended in calls if ids != [777]]
    for (started, ended), (next_started, _) in itertools.pairwise(times):
        assert next_started - ended >= 3 * (ended - started) * 0.99


# --- a delivery held up by a snapshot read ------------------------------------------------------


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    async for opened in open_sockets():
        yield opened


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
@pytest.mark.pubsub_layer
@pytest.mark.uuid_site
async def test_a_slow_snapshot_read_costs_one_more_resolve_not_one_per_window(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    # In a reconnect storm snapshot reads are slow; a user whose delivery skipped a connection
    # reading their snapshot is resolved again (for all their watchers) once that read is
    # over, not at every coalescing window while it lasts.
    window = 0.05
    with presence_settings(COALESCE_WINDOW=window):
        viewer, reading_viewer, target = [await new_user(make_user) for _ in range(3)]
        await lets_see(target, viewer, reading_viewer)
        watcher = await sockets.open(viewer)
        reloading = await sockets.open(reading_viewer)
        await subscribe(watcher, target)
        await subscribe(reloading, target)
        hub = Hub.current()
        assert hub is not None
        resolved: list[Any] = []
        deliver = hub.deliver

        async def counted(user_ids: Any) -> None:
            user_ids = list(user_ids)
            resolved.extend(user_ids)
            await deliver(user_ids)

        hub.deliver = counted  # type: ignore[method-assign]
        reader = next(c for c in hub.registry.connections if c.viewer_id == reading_viewer.pk)
        reader.snapshotting.add(target.pk)
        await sockets.open(target)
        assert (await receive(watcher))["presences"][str(target.pk)]["status"] == "online"
        await asyncio.sleep(30 * window)  # the read goes on for 30 windows
        during = resolved.count(target.pk)
        assert 1 <= during <= 2  # the change (and maybe the first heartbeat), nothing more
        reader.snapshotting.discard(target.pk)
        assert (await receive(reloading))["presences"][str(target.pk)]["status"] == "online"
        assert resolved.count(target.pk) == during + 1
        await assert_silent(watcher)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_a_delivery_held_up_by_a_read_goes_again_to_that_connection_alone(
    sockets: Sockets, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other watchers had the delivery: once the read is over, the user is resolved again
    # for the reading connection's viewer only (in a storm of openings thousands of reads end
    # one after another; each resolving the user for all its watchers fed the storm).
    window = 0.05
    with presence_settings(COALESCE_WINDOW=window):
        viewers = [await new_user(make_user) for _ in range(3)]
        reading_viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, *viewers, reading_viewer)
        watchers = [await sockets.open(viewer) for viewer in viewers]
        reloading = await sockets.open(reading_viewer)
        for communicator in [*watchers, reloading]:
            await subscribe(communicator, target)
        hub = Hub.current()
        assert hub is not None
        asked: list[set[Any]] = []
        resolve = lifecycle.apresence_for_viewers

        async def recorded(viewers_of: dict[Any, set[Any]]) -> Any:
            if target.pk in viewers_of:
                asked.append(set(viewers_of[target.pk]))
            return await resolve(viewers_of)

        monkeypatch.setattr(lifecycle, "apresence_for_viewers", recorded)
        reader = next(c for c in hub.registry.connections if c.viewer_id == reading_viewer.pk)
        reader.snapshotting.add(target.pk)
        await sockets.open(target)
        for watcher in watchers:
            assert (await receive(watcher))["presences"][str(target.pk)]["status"] == "online"
        assert asked == [{v.pk for v in [*viewers, reading_viewer]}]
        reader.snapshotting.discard(target.pk)
        assert (await receive(reloading))["presences"][str(target.pk)]["status"] == "online"
        assert asked[1:] == [{reading_viewer.pk}]
        await assert_silent(*watchers)
