"""The WebSocket consumer at ws/presence/: diffs on changes, and several devices of one user.

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import time_machine

from presence import lifecycle
from presence.conf import get_settings
from tests.live.sockets import (
    HIDDEN,
    Sockets,
    assert_silent,
    diff,
    heartbeat,
    iso,
    last_seen_row,
    lets_see,
    new_user,
    online,
    presence,
    receive,
    set_own_status,
    set_status,
    state,
    status_reply,
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


# --- diffs on changes -------------------------------------------------------------------------


async def test_no_diff_for_a_heartbeat_that_changes_nothing(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
    tab = await sockets.open(target)
    assert await receive(watcher) == diff({target.pk: online()})

    for _ in range(3):
        clock.shift(20)
        await heartbeat(tab, "active")
    await assert_silent(watcher)
    # The heartbeats were recorded: last seen moved (visible in a fresh snapshot)...
    other = await sockets.open(viewer)
    assert await subscribe(other, target) == state({target.pk: online(60)})
    # ... and the next real change is the very next frame the watcher gets.
    await heartbeat(tab, "idle")
    assert await receive(watcher) == diff({target.pk: presence("idle", iso(60), ["web"])})
    await heartbeat(tab, "active")
    assert await receive(watcher) == diff({target.pk: online(60)})


async def test_diffs_for_dnd_invisible_and_custom_status(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    tab = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})
    # The target watches itself too: it sees its true presence and the "invisible" flag.
    assert await subscribe(tab, target) == state({target.pk: online(invisible=False)})

    own = online(invisible=False, text=None)
    dnd = {**own, "status": "dnd"}
    assert await set_own_status(tab, status="dnd") == (status_reply(dnd), diff({target.pk: dnd}))
    assert await receive(watcher) == diff({target.pk: presence("dnd", iso(0), ["web"])})

    invisible = {**own, "invisible": True}
    assert await set_own_status(tab, status="invisible") == (
        status_reply(invisible),
        diff({target.pk: invisible}),
    )
    # To others invisible is exactly offline, with last seen hidden.
    assert await receive(watcher) == diff({target.pk: HIDDEN})

    custom = {"text": "In a meeting", "emoji": "📅", "activity": "Planning"}
    assert await set_own_status(tab, status="auto", **custom) == (
        status_reply({**own, **custom}),
        diff({target.pk: {**own, **custom}}),
    )
    assert await receive(watcher) == diff({target.pk: online(**custom)})

    assert await set_own_status(tab, status="auto", text="Lunch") == (
        status_reply({**own, "text": "Lunch"}),
        diff({target.pk: {**own, "text": "Lunch"}}),
    )
    assert await receive(watcher) == diff({target.pk: online(text="Lunch")})
    await assert_silent(watcher, tab)


async def test_custom_status_expires_by_itself(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    tab = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})
    reply = await set_status(tab, status="dnd", text="Focus", emoji="🎧", expires_in=60)
    # One's own presence says when its custom status clears (no one else's does).
    own = presence("dnd", iso(0), ["web"], "Focus", "🎧", invisible=False, expires_at=iso(60))
    assert reply == status_reply(own)
    assert await receive(watcher) == diff(
        {target.pk: presence("dnd", iso(0), ["web"], "Focus", "🎧")}
    )

    clock.shift(59)
    report = await lifecycle.asweep()
    assert (report.offline, report.expired_statuses) == ([], 0)
    await assert_silent(watcher)

    clock.shift(2)
    report = await lifecycle.asweep()
    assert (report.offline, report.expired_statuses) == ([], 1)
    # The text and emoji clear; the dnd choice stays.
    assert await receive(watcher) == diff({target.pk: presence("dnd", iso(0), ["web"])})
    assert (await lifecycle.asweep()).expired_statuses == 0  # claimed once
    await assert_silent(watcher)


# --- several devices --------------------------------------------------------------------------


async def test_devices_aggregate_across_connections(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
    web = await sockets.open(target, "?device=web")
    assert await receive(watcher) == diff({target.pk: online()})
    clock.shift(1)
    phone = await sockets.open(target, "?device=mobile")
    both = ("web", "mobile")
    assert await receive(watcher) == diff({target.pk: online(1, both)})

    # One idle and one active device: online, and nothing to tell.
    await heartbeat(web, "idle")
    await assert_silent(watcher)
    # Both idle: idle.
    await heartbeat(phone, "idle")
    assert await receive(watcher) == diff({target.pk: presence("idle", iso(1), both)})
    # One active again: online.
    await heartbeat(web, "active")
    assert await receive(watcher) == diff({target.pk: online(1, both)})
    # An explicit dnd wins over every device's activity...
    assert await set_status(phone, status="dnd") == status_reply(
        presence("dnd", iso(1), both, invisible=False)
    )
    assert await receive(watcher) == diff({target.pk: presence("dnd", iso(1), both)})
    await heartbeat(web, "idle")
    await heartbeat(phone, "idle")
    await assert_silent(watcher)
    assert await set_status(web, status="auto") == status_reply(
        presence("idle", iso(1), both, invisible=False)
    )
    assert await receive(watcher) == diff({target.pk: presence("idle", iso(1), both)})


async def test_closing_one_of_two_tabs_keeps_the_user_online(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    first = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})
    second = await sockets.open(target)
    phone = await sockets.open(target, "?device=mobile")
    assert await receive(watcher) == diff({target.pk: online(devices=("web", "mobile"))})

    # A second web tab closing changes nothing anyone sees.
    clock.shift(5)
    await sockets.close(second)
    await assert_silent(watcher)
    # The last mobile connection closing takes "mobile" off the devices, and nothing else.
    await sockets.close(phone)
    assert await receive(watcher) == diff({target.pk: online()})
    assert await last_seen_row(target) is None  # a connection is still open
    # The closes made the user due at the end of the grace...
    clock.shift(get_settings().OFFLINE_GRACE + 1)
    report = await lifecycle.asweep()
    # ... but the open tab keeps them online: checked again when its heartbeat runs out.
    assert (report.offline, report.rescheduled) == ([], 1)
    await assert_silent(watcher)
    interval = get_settings().HEARTBEAT_INTERVAL
    clock.shift(interval - 11)  # the tab's next heartbeat, an interval after its first
    await heartbeat(first, "active")
    assert await subscribe(first, target) == state({target.pk: online(interval, invisible=False)})
