"""When a viewer's ``presence_diff`` comes, end to end: at a time that depends only on the
changes it may see. X adding someone else to its contacts (a change of X's relation with Z,
which the viewer may not see) must not bring the diff of X's visible change (do not disturb)
sooner, as a window opened by X's first change did (docs/websocket.md; presence.hub.delivery:
the grid's ticks).

Real Redis, the real channel layer, WebsocketCommunicator; a long COALESCE_WINDOW, and the
changes made at chosen points of the process's windows (the event loop's clock), where a window
opened by the hidden change would end well before the visible change's. The rule alone, with
the loop's clock controlled: tests/live/test_diff_grid.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from presence.models import Contact
from tests.live.sockets import (
    BASE,
    Sockets,
    lets_see,
    new_user,
    receive,
    set_status,
    subscribe,
)
from tests.live.sockets import sockets as sockets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
]

WINDOW = 1.0
#: how far apart two diffs may come and still be "at the same time" (a loaded test machine)
SLACK = 0.2 * WINDOW


@pytest.fixture(autouse=True)
def _window(settings: Any) -> None:
    settings.PRESENCE = {**BASE, "COALESCE_WINDOW": WINDOW}


async def at_phase(phase: float) -> None:
    """Wait until the loop's clock is ``phase`` (0 to 1) into one of its windows."""
    into = (asyncio.get_running_loop().time() / WINDOW) % 1.0
    await asyncio.sleep(((phase - into) % 1.0) * WINDOW)


async def visible_change_delay(sockets: Sockets, make_user: Callable, hidden_first: bool) -> float:
    """How long after X's visible change (do not disturb) the viewer's diff comes, with or
    without X adding another user to its contacts first."""
    viewer, x, z = [await new_user(make_user) for _ in range(3)]
    await lets_see(x, viewer)
    tab = await sockets.open(x)
    watcher = await sockets.open(viewer)
    seen = await subscribe(watcher, x)
    assert seen["type"] == "presence_state" and seen["presences"][str(x.pk)]["status"] == "online"
    await at_phase(0.05)
    if hidden_first:
        await sync_to_async(Contact.objects.create)(owner=x, contact=z)
    await at_phase(0.7)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await set_status(tab, status="dnd"))["type"] == "status"
    told = await receive(watcher)
    delay = loop.time() - started
    assert told["type"] == "presence_diff", told
    assert told["presences"][str(x.pk)]["status"] == "dnd", told
    return delay


async def test_a_hidden_change_does_not_bring_a_visible_changes_diff_sooner(
    sockets: Sockets, make_user: Callable
) -> None:
    alone = await visible_change_delay(sockets, make_user, hidden_first=False)
    after = await visible_change_delay(sockets, make_user, hidden_first=True)
    assert abs(after - alone) < SLACK, (alone, after)
    assert max(alone, after) <= WINDOW + SLACK  # at most a window after the change
