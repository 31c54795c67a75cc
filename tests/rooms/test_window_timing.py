"""When a room's frames come (presence.hub.room_windows): a viewer's next ``room_count`` or
``room_diff`` comes at a time that depends only on the changes it may see. A member it may not
count (blocked either way) joining first must not bring the frame of a visible join sooner, as
a window opened by the room's first change did (docs/rooms.md, "Coalescing").

Real Redis, the real channel layer, WebsocketCommunicator; a long COALESCE_WINDOW, and the
changes made at chosen points of the process's windows (the event loop's clock), where a
window opened by the hidden join would end well before the visible join's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from presence.models import Block
from tests.live.sockets import Sockets, new_user, receive
from tests.live.sockets import sockets as sockets
from tests.rooms.rules import ROOMS
from tests.rooms.test_sockets import SETTINGS, join, public

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
]

WINDOW = 1.0
#: how far apart two frames may come and still be "at the same time" (a loaded test machine)
SLACK = 0.2 * WINDOW


@pytest.fixture(autouse=True)
def _room_settings(settings: Any) -> None:
    settings.PRESENCE = {**SETTINGS, "ROOMS": ROOMS, "COALESCE_WINDOW": WINDOW}


async def at_phase(phase: float) -> None:
    """Wait until the loop's clock is ``phase`` (0 to 1) into one of its windows."""
    into = (asyncio.get_running_loop().time() / WINDOW) % 1.0
    await asyncio.sleep(((phase - into) % 1.0) * WINDOW)


async def visible_join_delay(
    sockets: Sockets, make_user: Callable, room: str, watching: bool, hidden_first: bool
) -> float:
    """How long after a visible member's join the viewer is told (its count, or a room_diff
    listing them), with or without a member it may not see (it is blocked) joining first."""
    viewer, blocker, other = [await new_user(make_user) for _ in range(3)]
    await public(other, blocker)
    await sync_to_async(Block.objects.create)(blocker=blocker, blocked=viewer)
    v = await sockets.open(viewer)
    b = await sockets.open(blocker)
    o = await sockets.open(other)
    if watching:
        await v.send_json_to({"type": "watch_room_count", "room": room})
        assert await receive(v) == {"type": "room_count", "room": room, "count": 0}
    else:
        assert (await join(v, room))["count"] == 1
    await at_phase(0.05)
    if hidden_first:
        assert (await join(b, room))["type"] == "room_state"
    await at_phase(0.7)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await join(o, room))["type"] == "room_state"
    told = await receive(v)
    delay = loop.time() - started
    if watching:
        assert told == {"type": "room_count", "room": room, "count": 1}, told
    else:
        assert told["type"] == "room_diff" and set(told["joins"]) == {str(other.pk)}, told
        assert told["count"] == 2, told  # the blocker is not counted either
    return delay


@pytest.mark.parametrize("watching", [True, False], ids=["room_count", "room_diff"])
async def test_a_hidden_join_does_not_bring_a_visible_joins_frame_sooner(
    sockets: Sockets, make_user: Callable, watching: bool
) -> None:
    alone = await visible_join_delay(sockets, make_user, "post:1", watching, hidden_first=False)
    after = await visible_join_delay(sockets, make_user, "post:2", watching, hidden_first=True)
    assert abs(after - alone) < SLACK, (alone, after)
    assert max(alone, after) <= WINDOW + SLACK  # at most a window after the change
