"""A socket's opening request may say its client is idle already (``?state=idle``, as a hidden
tab's reconnect does, docs/websocket.md): the user is recorded idle from the first moment, so an
idle user's reconnect is no news to their watchers (it showed them online, then idle again at the
first heartbeat: in a reconnect storm, one announcement and one change stamp per idle user).

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import time_machine

from tests.live.sockets import (
    HIDDEN,
    TIMEOUT,
    Sockets,
    assert_silent,
    diff,
    error,
    heartbeat,
    iso,
    lets_see,
    new_user,
    online,
    presence,
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
    pytest.mark.pubsub_layer,
]


async def watched(sockets: Sockets, make_user: Callable[..., Any]) -> tuple[Any, Any]:
    """A target and a socket of a viewer who may see it, subscribed to it."""
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
    return target, watcher


async def test_a_socket_opened_idle_shows_its_user_idle_from_the_start(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    target, watcher = await watched(sockets, make_user)
    tab = await sockets.open(target, "?state=idle")
    assert await receive(watcher) == diff({target.pk: presence("idle", iso(0), ["web"])})
    # Its first heartbeat says idle too: nothing changed.
    await heartbeat(tab, "idle")
    await assert_silent(watcher)
    # Back at the keyboard: online.
    clock.shift(5)
    await heartbeat(tab, "active")
    assert await receive(watcher) == diff({target.pk: online(5)})


async def test_an_idle_client_reconnecting_idle_is_no_news(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    """The old socket still counts (its process died: no close), as in a reconnect storm."""
    target, watcher = await watched(sockets, make_user)
    old = await sockets.open(target)
    assert await receive(watcher) == diff({target.pk: online()})
    await heartbeat(old, "idle")
    assert await receive(watcher) == diff({target.pk: presence("idle", iso(0), ["web"])})
    clock.shift(3)
    again = await sockets.open(target, "?state=idle")
    # (answered after its opening write: recorded idle by then)
    own = presence("idle", iso(3), ["web"], invisible=False)
    assert await subscribe(again, target) == state({target.pk: own})
    await assert_silent(watcher)
    await heartbeat(again, "idle")
    await assert_silent(watcher)
    # Opened without its state, the same reconnect showed the user online to every watcher.
    clock.shift(3)
    active = await sockets.open(target)
    assert await receive(watcher) == diff({target.pk: online(6)})
    await heartbeat(active, "idle")
    assert await receive(watcher) == diff({target.pk: presence("idle", iso(6), ["web"])})


async def test_an_unknown_state_is_an_error_and_the_socket_opens_active(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    target, watcher = await watched(sockets, make_user)
    tab = sockets.make(target, "?state=asleep")
    assert await tab.connect(timeout=TIMEOUT) == (True, None)
    assert await receive(tab) == error(
        "invalid_value", "Unknown state 'asleep': use 'active' or 'idle'."
    )
    assert await receive(watcher) == diff({target.pk: online()})
    assert await subscribe(tab, target) == state({target.pk: online(invisible=False)})
