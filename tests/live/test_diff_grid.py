"""When presence diffs come (presence.hub.delivery), with the event loop's clock controlled
(tests.loop_clock): a user's changes are delivered at the first tick after them of the
process's grid (a tick every COALESCE_WINDOW, as rooms are), so a change of X a viewer may not
see (X's relation with someone else) never brings the diff of a change it may see (X going
offline) sooner, as a window opened by X's first change did (docs/websocket.md).

What is delivered is recorded, as tests/live/test_pacing.py does (when, not how); the whole
path, sockets and all, is tests/live/test_diff_timing.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from presence.domain import LIVE_CHANGE, relation_change
from presence.hub.delivery import Delivery
from presence.hub.registry import Registry
from tests.live.sockets import BASE
from tests.loop_clock import START, LoopClock
from tests.loop_clock import loop_clock as loop_clock

WINDOW = 1.0
X, Y, Z = 1, 2, 3


@pytest.fixture(autouse=True)
def _window(settings: Any) -> None:
    settings.PRESENCE = {**BASE, "COALESCE_WINDOW": WINDOW}


class _Viewer:
    """A connection as the registry holds it (never sent to: the delivery is recorded)."""


Delivered = list[tuple[list[Any], float]]


@pytest.fixture
async def delivery(loop_clock: LoopClock) -> AsyncIterator[tuple[Delivery, Delivered]]:
    """A Delivery whose loop runs, a viewer watching X and Y, each delivery recorded (users,
    loop time)."""
    registry = Registry()
    viewer = _Viewer()
    for uid in (X, Y):
        registry.watchers.add(viewer, uid)  # type: ignore[arg-type]
    users = Delivery(registry)
    delivered: Delivered = []

    async def deliver(user_ids: list[Any]) -> None:
        delivered.append((list(user_ids), loop_clock.now))

    running = True
    task = asyncio.ensure_future(users._rounds(deliver, lambda: running))
    yield users, delivered
    running = False
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def first_delivery_of_x(clock: LoopClock, delivered: Delivered, since: float) -> float:
    """When X's first delivery at ``since`` or later comes (the clock moved by steps of a
    quarter of a window, the ticks among them)."""
    for step in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 3.0):
        if START + step > clock.now:
            await clock.move_to(START + step)
    return next(at for ids, at in delivered if X in ids and at >= since)


@pytest.mark.parametrize("hidden_first", [False, True], ids=["alone", "after_a_hidden_change"])
async def test_a_hidden_change_does_not_bring_a_visible_changes_diff_sooner(
    loop_clock: LoopClock, delivery: tuple[Delivery, Delivered], hidden_first: bool
) -> None:
    users, delivered = delivery
    await loop_clock.move_to(START + 0.05)
    if hidden_first:
        users.changed([X], change=relation_change([Z]))  # X follows Z: not the viewer's news
    await loop_clock.move_to(START + 0.7)
    users.changed([X], change=LIVE_CHANGE)  # X goes offline: the viewer sees it
    # At the tick after the visible change, hidden change or not (a window opened by the
    # hidden one ended at 1.05, a window opened by the visible one at 1.7).
    assert await first_delivery_of_x(loop_clock, delivered, START + 0.7) == START + 1


@pytest.mark.parametrize("hidden_first", [False, True], ids=["alone", "after_a_hidden_change"])
async def test_a_user_is_delivered_at_the_tick_not_before(
    loop_clock: LoopClock, delivery: tuple[Delivery, Delivered], hidden_first: bool
) -> None:
    # Read 3 ms early (another user's change woke the loop), X would be recorded as delivered
    # at the tick, and a visible change made 2 ms before the tick would wait a window more.
    users, delivered = delivery
    await loop_clock.move_to(START + 0.3)
    if hidden_first:
        users.changed([X], change=relation_change([Z]))
    await loop_clock.move_to(START + 0.997)
    users.changed([Y], change=LIVE_CHANGE)
    await loop_clock.move_to(START + 0.998)
    users.changed([X], change=LIVE_CHANGE)
    assert await first_delivery_of_x(loop_clock, delivered, START + 0.998) == START + 1
    assert all(at >= START + 1 for _, at in delivered), delivered


async def test_a_user_is_delivered_at_most_once_per_window(
    loop_clock: LoopClock, delivery: tuple[Delivery, Delivered]
) -> None:
    users, delivered = delivery
    await loop_clock.move_to(START + 0.5)
    users.changed([X], change=LIVE_CHANGE)
    await loop_clock.move_to(START + 1)
    assert delivered == [([X], START + 1)]
    # Changed again at the very tick it was delivered at: the next tick, a window later.
    users.changed([X], change=LIVE_CHANGE)
    await loop_clock.move_to(START + 1.5)
    assert len(delivered) == 1
    await loop_clock.move_to(START + 2)
    assert delivered == [([X], START + 1), ([X], START + 2)]
