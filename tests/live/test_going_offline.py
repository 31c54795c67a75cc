"""The WebSocket consumer at ws/presence/: going offline (reload grace, last seen, crashed
connections).

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import time_machine

from presence import lifecycle
from presence.conf import get_settings
from tests.clock import at
from tests.live.sockets import (
    HIDDEN,
    QUIET,
    Sockets,
    assert_silent,
    connections_in_redis,
    diff,
    heartbeat,
    iso,
    last_seen_row,
    lets_see,
    new_user,
    online,
    presence,
    presence_settings,
    receive,
    set_status,
    state,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets
from tests.loop_clock import at_phase, tick_after

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]


# --- going offline: reload grace, last seen, crashed connections ------------------------------


async def test_reload_within_the_grace_does_not_flap(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    grace = get_settings().OFFLINE_GRACE
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    tab = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})

    clock.shift(10)
    await sockets.close(tab)  # a reload: the page goes...
    await assert_silent(watcher)
    clock.shift(grace - 1)
    tab = await sockets.open(target)  # ... and comes back within the grace
    await assert_silent(watcher)
    clock.shift(2)  # past the end of the first grace
    assert (await lifecycle.asweep()).offline == []
    await assert_silent(watcher)

    # Closed for good: still online during the grace, offline after it.
    closed_at = 10 + grace + 1
    await sockets.close(tab)
    clock.shift(grace)  # the grace counts from the end of the close's second: not yet
    assert (await lifecycle.asweep()).offline == []
    await assert_silent(watcher)
    clock.shift(1)
    assert (await lifecycle.asweep()).offline == [target.pk]
    assert await receive(watcher) == diff({target.pk: presence("offline", iso(closed_at))})
    # Last seen is persisted when the user turns offline: the close's moment.
    assert await last_seen_row(target) == at(closed_at)


async def test_last_seen_is_persisted_once_the_last_connection_ends_for_good(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    grace = get_settings().OFFLINE_GRACE
    user = await new_user(make_user)
    first = await sockets.open(user)
    second = await sockets.open(user, "?device=desktop")
    clock.shift(30)
    await sockets.close(first)
    clock.shift(30)
    await sockets.close(second)
    # A page view's close: the next page's socket comes within the grace, so nothing is
    # written yet; a reload is no visit's end.
    clock.shift(grace)
    assert (await lifecycle.asweep()).offline == []
    third = await sockets.open(user)
    clock.shift(grace + 1)
    assert (await lifecycle.asweep()).offline == []
    assert await last_seen_row(user) is None
    clock.shift(10)
    await sockets.close(third)
    clock.shift(grace + 1)
    # Gone for good: the end of the last connection is persisted, once.
    assert (await lifecycle.asweep()).offline == [user.pk]
    assert await last_seen_row(user) == at(60 + grace + grace + 1 + 10)


async def test_a_silent_connection_is_dropped_after_its_ttl(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    ttl = get_settings().CONNECTION_TTL
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    tab = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})

    # A heartbeat within the TTL keeps a connection alive past its first deadline.
    last_beat = ttl - 10
    clock.shift(last_beat)
    await heartbeat(tab)
    await heartbeat(watcher)
    clock.shift(20)
    assert (await lifecycle.asweep()).offline == []
    await assert_silent(watcher)

    # Then the target's connection goes silent (its process was killed: no close ever comes).
    clock.shift(ttl - 20 - 1)
    await heartbeat(watcher)
    assert (await lifecycle.asweep()).offline == []
    await assert_silent(watcher)
    clock.shift(2)
    assert (await lifecycle.asweep()).offline == [target.pk]
    assert await receive(watcher) == diff({target.pk: presence("offline", iso(last_beat))})
    # Last seen persisted at the last heartbeat; the dead connection is gone from Redis.
    assert await last_seen_row(target) == at(last_beat)
    assert await connections_in_redis(target) == []
    # A fresh snapshot agrees.
    assert await subscribe(await sockets.open(viewer), target) == state(
        {target.pk: presence("offline", iso(last_beat))}
    )


async def test_a_crash_swept_exactly_at_the_ttl_persists_last_seen(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    ttl = get_settings().CONNECTION_TTL
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})
    clock.shift(ttl)  # the TTL counts from the end of the heartbeat's second: not yet
    await heartbeat(watcher)
    assert (await lifecycle.asweep()).offline == []
    # The target's deadline: due now, and gone by domain.live_status's rule; the store drops
    # the connection at the same moment (sweeps run every second: this is the common case).
    clock.shift(1)
    assert (await lifecycle.asweep()).offline == [target.pk]
    assert await receive(watcher) == diff({target.pk: presence("offline", iso(0))})
    assert await connections_in_redis(target) == []
    assert await last_seen_row(target) == at(0)


async def test_changes_within_the_coalescing_window_make_one_diff(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # Long enough for an opening, two set_status and a heartbeat on a machine saturated by
    # other work (the changes must all fall in one window).
    window = 2.0
    with presence_settings(COALESCE_WINDOW=window):
        viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, viewer)
        watcher = await sockets.open(viewer)
        assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
        loop = asyncio.get_running_loop()
        await at_phase(0.05, window)
        tick = tick_after(loop.time(), window)
        tab = await sockets.open(target)  # online
        await set_status(tab, status="dnd")  # dnd
        await heartbeat(tab, "idle")  # still dnd
        await set_status(tab, status="auto", text="Away", emoji="🌙")  # idle, with a text
        assert loop.time() < tick, "the changes took longer than the window"
        assert await receive(watcher) == diff(
            {target.pk: presence("idle", iso(0), ["web"], "Away", "🌙")}
        )
        assert loop.time() >= tick  # at the grid's tick after them
        await assert_silent(watcher, seconds=window + QUIET)
