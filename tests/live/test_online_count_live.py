"""The site's online count kept live over the WebSocket (``watch_count`` / ``online_count``):
answered at once, pushed when it changes, at most once per COUNT_INTERVAL per socket however
many users come and go, read once per process per interval whatever the number of sockets
watching, and nothing for sockets that did not ask.

Time that matters (time.time) is the ``clock`` fixture's; the hub's loop looks every TICK (real
seconds) whether something is due. Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from channels.testing import WebsocketCommunicator

from presence import consumers
from presence.api._counting import COUNT_INTERVAL
from presence.domain import Device
from presence.hub import Hub
from presence.hub.counts import TICK
from presence.store import get_store, merge
from tests.clock import T0
from tests.conftest import RedisCommandCounter
from tests.live.sockets import (
    TIMEOUT,
    Sockets,
    Stall,
    assert_silent,
    eventually,
    new_user,
    receive,
    state,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
]

#: long enough for the hub's loop to have looked twice (a due update would have come)
SILENCE = 2 * TICK + 0.3


def count(n: int) -> dict[str, Any]:
    return {"type": "online_count", "count": n}


async def touch_ids(first: int, how_many: int, at: float) -> None:
    """``how_many`` users (ids only) seen by a page view at ``at`` seconds after T0."""
    store = get_store()
    now = T0.timestamp() + at
    await store.arun(
        merge([store.plans.touch(first + i, Device.WEB, now) for i in range(how_many)])
    )


async def watch(communicator: WebsocketCommunicator) -> dict[str, Any]:
    await communicator.send_json_to({"type": "watch_count"})
    return await receive(communicator)


async def test_a_socket_that_asked_gets_the_count_then_at_most_one_update_per_interval(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    assert COUNT_INTERVAL == 5
    watcher = await sockets.open(await new_user(make_user))
    assert await watch(watcher) == count(1)  # its own user, connected
    # Users come online second after second: nothing before the interval has passed.
    for second in range(1, 5):
        clock.shift(1)
        await touch_ids(10_000 + 100 * second, 10, at=second)
        await assert_silent(watcher, seconds=SILENCE)
    clock.shift(1)  # 5 s after the first answer: one update, with everyone
    assert await receive(watcher) == count(41)
    await assert_silent(watcher, seconds=SILENCE)
    # More churn: again one update, a full interval after the last.
    await touch_ids(20_000, 3, at=5)
    clock.shift(4.5)
    await assert_silent(watcher, seconds=SILENCE)
    clock.shift(0.5)
    assert await receive(watcher) == count(44)
    # No change, no frame.
    clock.shift(COUNT_INTERVAL)
    await assert_silent(watcher, seconds=SILENCE)


async def test_one_reading_per_process_for_many_sockets(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_commands: RedisCommandCounter,
) -> None:
    watchers = [await sockets.open(await new_user(make_user)) for _ in range(12)]
    hub = Hub.current()
    assert hub is not None
    per_reading = len(list(get_store().keys.shards()))  # one ZCOUNT per shard
    before = redis_commands.snapshot()
    for watcher in watchers:
        await watcher.send_json_to({"type": "watch_count"})
    for watcher in watchers:
        assert await receive(watcher) == count(12)
    assert redis_commands.delta(before) == {"zcount": per_reading}
    assert hub.counts.readings == 1

    await touch_ids(30_000, 5, at=0)
    before = redis_commands.snapshot()
    clock.shift(COUNT_INTERVAL)
    for watcher in watchers:
        assert await receive(watcher) == count(17)
    assert redis_commands.delta(before) == {"zcount": per_reading}
    assert hub.counts.readings == 2


async def test_sockets_that_did_not_ask_or_stopped_get_nothing_and_cost_nothing(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    never = await sockets.open(await new_user(make_user))
    stopped = await sockets.open(await new_user(make_user))
    assert await watch(stopped) == count(2)
    await stopped.send_json_to({"type": "unwatch_count"})
    hub = Hub.current()
    assert hub is not None
    await assert_silent(stopped, seconds=SILENCE)
    assert hub.counts.watchers == {}
    readings = hub.counts.readings
    await touch_ids(40_000, 5, at=0)
    clock.shift(2 * COUNT_INTERVAL)
    await assert_silent(never, stopped, seconds=SILENCE)
    assert hub.counts.readings == readings  # no loop reads it for nobody


async def test_a_closed_socket_leaves_the_count_and_the_others_go_on(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    leaving = await sockets.open(await new_user(make_user))
    staying = await sockets.open(await new_user(make_user))
    assert await watch(leaving) == count(2)
    assert await watch(staying) == count(2)
    await sockets.close(leaving)
    hub = Hub.current()
    assert hub is not None
    assert list(hub.counts.watchers) == [c for c in hub.registry.connections]  # only the one left
    await touch_ids(50_000, 2, at=0)
    clock.shift(COUNT_INTERVAL)
    # The closed socket's user is offline after its grace only (OFFLINE_GRACE 5 s): still 2 + 2.
    assert await receive(staying) == count(4)


async def _a_count_held_for_a_slow_watcher(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
) -> tuple[WebsocketCommunicator, WebsocketCommunicator, Stall]:
    """A slow watcher and a fast one: the count's update to 5 went to both, and the slow
    client's send of it is held (it stopped reading)."""
    stall = Stall("online_count")
    slow = sockets.make(await new_user(make_user), app=stall.app())
    assert (await slow.connect(timeout=TIMEOUT))[0]
    assert await subscribe(slow) == state({})  # (its opening heartbeat recorded)
    fast = await sockets.open(await new_user(make_user))
    assert await watch(slow) == count(2)
    assert await watch(fast) == count(2)
    stall.armed.set()
    await touch_ids(60_000, 3, at=0)
    clock.shift(COUNT_INTERVAL)
    assert await receive(fast) == count(5)
    await asyncio.wait_for(stall.held.wait(), TIMEOUT)
    return slow, fast, stall


async def test_a_watcher_that_reads_nothing_holds_up_no_later_count_of_another(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a server whose send waits, the count to a client that reads nothing waits up to
    SEND_TIMEOUT: the next interval's update reaches the other watchers meanwhile (the loop is
    not held until then), and the slow client's own updates still come in order."""
    monkeypatch.setattr(consumers.sending, "SEND_TIMEOUT", 60.0)  # longer than any wait here
    slow, fast, stall = await _a_count_held_for_a_slow_watcher(sockets, make_user, clock)
    await touch_ids(61_000, 2, at=COUNT_INTERVAL)
    clock.shift(COUNT_INTERVAL)
    # The next interval's update, while the slow client's send is still held.
    assert await receive(fast) == count(7)
    assert not stall.drained.is_set()
    stall.drained.set()
    assert await receive(slow) == count(5)
    assert await receive(slow) == count(7)


async def test_a_count_queued_behind_a_held_send_is_not_sent_after_an_unwatch(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(consumers.sending, "SEND_TIMEOUT", 60.0)
    slow, fast, stall = await _a_count_held_for_a_slow_watcher(sockets, make_user, clock)
    await touch_ids(61_000, 2, at=COUNT_INTERVAL)
    clock.shift(COUNT_INTERVAL)
    assert await receive(fast) == count(7)  # (the slow client's update queued meanwhile)
    await slow.send_json_to({"type": "unwatch_count"})
    hub = Hub.current()
    assert hub is not None
    assert await eventually(lambda: len(hub.counts.watchers) == 1)
    stall.drained.set()
    assert await receive(slow) == count(5)
    await assert_silent(slow, seconds=SILENCE)
