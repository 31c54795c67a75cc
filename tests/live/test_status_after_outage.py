"""A status chosen while presence's Redis could not take it, and a Redis that lost what it held
of the users' choices (restarted empty): the online count and the ledger's signals still leave
invisible users out, and a custom status's end still reaches the views open on it
(presence.copies).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import time_machine
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from presence import api, copies, lifecycle, signals
from presence import store as store_module
from presence.conf import get_settings
from presence.store import get_store
from tests.conftest import on_one_redis
from tests.live.sockets import (
    Sockets,
    eventually,
    heartbeat,
    lets_see,
    new_user,
    online,
    presence_settings,
    receive,
    set_status,
    state,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets
from tests.live.test_hub import unreachable_presence_redis

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
]

#: (user id, invisible) of each user_online sent in the test
Onlines = list[tuple[Any, bool]]


@pytest.fixture
def onlines() -> Iterator[Onlines]:
    got: Onlines = []

    def record(sender: Any, user_id: Any, invisible: bool, **kwargs: Any) -> None:
        got.append((user_id, invisible))

    signals.user_online.connect(record)
    yield got
    signals.wait_sent()
    signals.user_online.disconnect(record)


async def watched_online(
    sockets: Sockets, make_user: Callable[..., Any]
) -> tuple[Any, WebsocketCommunicator, WebsocketCommunicator]:
    """A target its contact's open socket watches, online by a tab of its own: (the target,
    the watcher's socket, the target's tab)."""
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    tab = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})
    return target, watcher, tab


async def sent(got: Onlines, user: Any) -> list[bool]:
    """The ``invisible`` of each user_online of ``user`` so far, once the receivers had them."""
    await asyncio.to_thread(signals.wait_sent)
    return [invisible for user_id, invisible in got if user_id == user.pk]


async def counted(expected: int) -> bool:
    return await eventually(lambda: _count_is(expected))


async def _count_is(expected: int) -> bool:
    return await api.aonline_count() == expected


# --- a choice Redis could not take -----------------------------------------------------------


@on_one_redis
async def test_invisible_chosen_while_redis_is_down_is_left_out_once_it_answers(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    settings: Any,
    onlines: Onlines,
) -> None:
    with presence_settings(RETRY_INTERVAL=0.2):
        target, watcher, tab = await watched_online(sockets, make_user)
        assert await api.aonline_count() == 2
        with unreachable_presence_redis(settings):
            reply = await set_status(tab, status="invisible")
            assert reply["presence"]["invisible"] is True  # saved: the database took it
        await receive(watcher)  # (the target now offline to the viewer)
        # Redis answers again: the count leaves the target out, though nobody changed a thing.
        assert await counted(1)
        # Their next online is signalled invisible: a site sends no "friend online" for it.
        await sockets.close(tab)
        clock.shift(get_settings().OFFLINE_GRACE + 2)
        await lifecycle.asweep()
        await sockets.open(target)
        assert (await sent(onlines, target))[-1] is True
        assert await api.aonline_count() == 1


@on_one_redis
async def test_a_custom_status_end_set_while_redis_is_down_reaches_open_views(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    settings: Any,
) -> None:
    with presence_settings(RETRY_INTERVAL=0.2):
        target, watcher, tab = await watched_online(sockets, make_user)
        with unreachable_presence_redis(settings):
            await set_status(tab, status="auto", text="Lunch", expires_in=60)
        assert (await receive(watcher))["presences"][str(target.pk)]["text"] == "Lunch"
        clock.shift(61)
        await heartbeat(tab)
        await heartbeat(watcher)

        async def swept_and_told() -> bool:
            await lifecycle.asweep()
            return not await watcher.receive_nothing(timeout=0.05)

        # The sweep that finds the status ended tells the open view (no cleanup needed).
        assert await eventually(swept_and_told)
        assert (await receive(watcher))["presences"][str(target.pk)]["text"] is None


@on_one_redis
async def test_cleanup_tells_open_views_of_the_custom_statuses_it_clears(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    settings: Any,
) -> None:
    with presence_settings(RETRY_INTERVAL=0.2):
        target, watcher, tab = await watched_online(sockets, make_user)
        with unreachable_presence_redis(settings):
            await set_status(tab, status="auto", text="Lunch", expires_in=60)
            copies.forget()  # as a process that ended before Redis answered again
        assert (await receive(watcher))["presences"][str(target.pk)]["text"] == "Lunch"
        clock.shift(61)
        await heartbeat(tab)
        await heartbeat(watcher)
        assert (await lifecycle.asweep()).expired_statuses == 0  # Redis never had its end
        assert await watcher.receive_nothing(timeout=0.2)
        report = await sync_to_async(api.cleanup)()
        assert report.expired_statuses == 1
        assert (await receive(watcher))["presences"][str(target.pk)]["text"] is None


# --- a Redis that lost the choices --------------------------------------------------------------


async def test_an_invisible_user_stays_out_when_redis_restarts_empty(
    sockets: Sockets,
    make_user: Callable[..., Any],
    private_redis: Any,
    onlines: Onlines,
) -> None:
    # (the hub's sweeps find the outage, as test_hub's outage test)
    with presence_settings(SWEEP_INTERVAL=0.1, RETRY_INTERVAL=0.2):
        viewer, target = await new_user(make_user), await new_user(make_user)
        await sync_to_async(api.set_status)(target, "invisible")
        tab = await sockets.open(target)
        watcher = await sockets.open(viewer)
        assert await counted(1)  # (this Redis is new: seeded after its first write)
        assert await sent(onlines, viewer) == [False]
        private_redis.stop()
        assert await eventually(lambda: get_store().health.in_outage)
        private_redis.start()
        assert await eventually(lambda: not get_store().health.in_outage)
        # Redis holds nothing: each socket's next heartbeat written (a change of state is,
        # at once) records it again, online.
        await heartbeat(tab, "idle")
        assert await api.aonline_count() == 0  # not the target, even before anything is seeded
        await heartbeat(watcher, "idle")
        assert await counted(1)  # the viewer
        assert await sent(onlines, target) == [True, True]  # before the restart, and after
        assert await sent(onlines, viewer) == [False, False]
        assert await api.aonline_count() == 1


def test_a_choice_made_after_the_snapshot_redis_restarts_from_is_not_lost(
    make_user: Callable[..., Any], private_redis: Any, onlines: Onlines
) -> None:
    user = make_user()
    copies.seed()  # (this Redis is new: seeded as its first write would have it)
    snapshots = redis.Redis.from_url(private_redis.url)
    snapshots.save()  # a periodic snapshot (RDB)
    snapshots.close()
    api.set_status(user, "invisible")  # chosen after it
    private_redis.stop()  # Redis crashes, and restarts from the snapshot
    private_redis.start()
    store_module.reset_clients()  # (the process's connections to it, made again)
    api.touch(user)
    assert api.online_count() == 0
    signals.wait_sent()
    assert [invisible for user_id, invisible in onlines if user_id == user.pk] == [True]
    # Seeded again from the database meanwhile: the choice stands for good.
    store = get_store()
    assert eventually_true(lambda: store.run(store.plans.unseeded_shards()) == [])
    assert store.run(store.plans.invisible_members()) == {user.pk}
    assert api.online_count() == 0


def eventually_true(check: Callable[[], bool], seconds: float = 10) -> bool:
    """Whether ``check()`` holds within ``seconds`` (work of a thread of presence's own)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
