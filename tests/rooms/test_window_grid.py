"""The rooms' grid (presence.hub.room_windows) with the event loop's clock controlled
(tests.loop_clock): a room is delivered at its tick, not a moment before, so a change a viewer
may not see that had the room pending moves no frame of a change it may see.

What is delivered is recorded (no Redis needed: when, not how); the whole path, sockets and
all, is tests/rooms/test_window_timing.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from presence.hub import sends
from presence.hub.groups import Groups
from presence.hub.registry import Registry
from presence.hub.room_counts import RoomCounts
from presence.hub.room_windows import RoomWindows
from tests.live.sockets import BASE
from tests.loop_clock import START, LoopClock
from tests.loop_clock import loop_clock as loop_clock

WINDOW = 1.0


@pytest.fixture(autouse=True)
def _window(settings: Any) -> None:
    settings.PRESENCE = {**BASE, "COALESCE_WINDOW": WINDOW}


Delivered = list[tuple[str, set[Any], float]]


@pytest.fixture
async def windows(loop_clock: LoopClock) -> AsyncIterator[tuple[RoomWindows, Delivered]]:
    """A RoomWindows whose loop runs, recording each delivery (room, users, loop time)."""
    room_windows = RoomWindows()
    delivered: Delivered = []

    async def deliver(room: str, users: set[Any]) -> None:
        delivered.append((room, set(users), loop_clock.now))

    running = True
    task = asyncio.ensure_future(room_windows.run(lambda: running, deliver, lambda r, u: None))
    yield room_windows, delivered
    running = False
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def delivered_at(delivered: Delivered, room: str, user: Any) -> float:
    return next(at for r, users, at in delivered if r == room and user in users)


async def visible_change_delivered(
    clock: LoopClock,
    windows: tuple[RoomWindows, Delivered],
    hidden_first: bool,
) -> float:
    """When a change the viewer may see, made 2 ms before a tick, is delivered: with or
    without a hidden change (a blocked member joining) having the room pending, and another
    room's change waking the loop 3 ms before the tick."""
    room_windows, delivered = windows
    tick = START + 1
    await clock.move_to(START + 0.3)
    if hidden_first:
        room_windows.changed("post:1", {"hidden"}, None)
    await clock.move_to(tick - 0.003)
    room_windows.changed("post:2", {"other"}, None)
    await clock.settle()
    await clock.move_to(tick - 0.002)
    room_windows.changed("post:1", {"visible"}, None)
    await clock.settle()
    for step in (tick, tick + WINDOW / 2, tick + WINDOW, tick + 2 * WINDOW):
        await clock.move_to(step)
    return delivered_at(delivered, "post:1", "visible")


@pytest.mark.parametrize("hidden_first", [False, True], ids=["alone", "after_a_hidden_change"])
async def test_a_room_is_delivered_at_its_tick_not_before(
    loop_clock: LoopClock, windows: tuple[RoomWindows, Delivered], hidden_first: bool
) -> None:
    # Read 3 ms early (another room's change woke the loop) the room would be recorded as
    # delivered at the tick, and the visible change made 2 ms before the tick would wait a
    # whole window: only because the hidden change had the room pending.
    at = await visible_change_delivered(loop_clock, windows, hidden_first)
    assert at == START + 1
    _, delivered = windows
    # Every room at the tick, none before it.
    assert all(when >= START + 1 for _, _, when in delivered), delivered


# --- a delivery again: after W at the latest ------------------------------------------------


async def test_a_delivery_again_comes_by_the_time_asked(
    loop_clock: LoopClock, windows: tuple[RoomWindows, Delivered]
) -> None:
    # A view read while its room was delivered gets the room again "a window later at the
    # latest": at the last tick by then, not the first after it (up to two windows).
    room_windows, delivered = windows
    await loop_clock.move_to(START + 0.1)
    room_windows.again("post:1", {"member"}, WINDOW)
    assert room_windows.pending["post:1"][1] == START + 1
    await loop_clock.move_to(START + 1)
    assert delivered == [("post:1", {"member"}, START + 1)]
    # Asked again at the tick it was delivered at: the next tick, a window later (never
    # twice in a window).
    room_windows.again("post:1", {"member"}, WINDOW)
    assert room_windows.pending["post:1"][1] == START + 2
    # Asked for sooner than a window: at the next tick.
    room_windows.again("post:2", {"member"}, WINDOW / 4)
    assert room_windows.pending["post:2"][1] == START + 2


async def test_a_watched_count_again_comes_by_the_time_asked(loop_clock: LoopClock) -> None:
    registry = Registry()
    counts = RoomCounts(registry, Groups(None, registry), sends.InOrder())
    registry.room_counts.add(object(), "post:1")  # type: ignore[arg-type]
    await loop_clock.move_to(START + 0.1)
    counts.again(["post:1"], WINDOW)
    assert counts.pending["post:1"] == START + 1


# --- a room left while another of its tick is delivered -------------------------------------


@pytest.mark.parametrize("joined_again", [False, True], ids=["left", "left_and_joined_again"])
async def test_a_room_left_during_its_ticks_delivery_stops_no_delivery(
    loop_clock: LoopClock, joined_again: bool
) -> None:
    # Two rooms due at one tick; while the first is delivered (reading Redis), the last
    # connection here leaves the second (HubRooms.exit -> forget). The loop must go on: a
    # KeyError there ended it, and no room of the process was delivered again.
    room_windows = RoomWindows()
    delivered: Delivered = []
    reading = asyncio.Event()

    async def deliver(room: str, users: set[Any]) -> None:
        delivered.append((room, set(users), loop_clock.now))
        if room == "post:1" and not reading.is_set():
            await reading.wait()

    running = True
    task = asyncio.ensure_future(room_windows.run(lambda: running, deliver, lambda r, u: None))
    try:
        await loop_clock.move_to(START + 0.1)
        room_windows.changed("post:1", {"a"}, None)
        room_windows.changed("post:2", {"b"}, None)
        await loop_clock.move_to(START + 1)
        assert [room for room, _, _ in delivered] == ["post:1"]  # its read under way
        room_windows.forget("post:2")
        if joined_again:
            # A change of the room joined again is due at the next tick, not this one.
            room_windows.changed("post:2", {"c"}, None)
        reading.set()
        await loop_clock.settle()
        assert not task.done(), task
        room_windows.changed("post:1", {"d"}, None)
        await loop_clock.move_to(START + 2)
        expected = [("post:1", {"a"}, START + 1), ("post:1", {"d"}, START + 2)]
        if joined_again:
            expected.append(("post:2", {"c"}, START + 2))
        assert sorted(delivered) == sorted(expected)
    finally:
        running = False
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
