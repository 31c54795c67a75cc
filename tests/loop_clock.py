"""The running event loop's clock under the test's control (the ``loop_clock`` fixture): it
stands still until the test moves it, and what the loop schedules (``call_at``, ``wait_for``'s
timeouts) and what the code reads (``loop.time()``) follow it. For the coalescing grid's rules
(presence.hub.room_windows), where a few milliseconds decide, without sleeping to a moment a
loaded machine would miss."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest

#: loop time the clock starts at (a whole number: a tick of any window that divides it)
START = 1000.0
#: how many turns of the loop a move lets pass (the loops under test need a handful)
TURNS = 50


class LoopClock:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.now = START

    def time(self) -> float:
        return self.now

    async def settle(self) -> None:
        """Let every task run what it can at this time (timers due now fire)."""
        for _ in range(TURNS):
            await asyncio.sleep(0)

    async def move_to(self, when: float) -> None:
        """Time is ``when`` (never back): what is due by then runs, at that time."""
        assert when >= self.now, (when, self.now)
        self.now = when
        await self.settle()


@pytest.fixture
async def loop_clock() -> AsyncIterator[LoopClock]:
    """The test's event loop on a LoopClock; its own clock back after the test (whose tasks
    must be over: what they scheduled is on the controlled clock)."""
    loop = asyncio.get_running_loop()
    clock = LoopClock(loop)
    loop.time = clock.time  # type: ignore[method-assign]
    try:
        yield clock
    finally:
        del loop.time


# --- the real loop clock: tests placing changes on the grid (presence.hub.room_windows) --------


async def at_phase(phase: float, window: float) -> None:
    """Wait until the running loop's clock is ``phase`` (0 to 1) into one of the grid's windows
    of ``window`` seconds."""
    into = (asyncio.get_running_loop().time() / window) % 1.0
    await asyncio.sleep(((phase - into) % 1.0) * window)


def tick_after(loop_time: float, window: float) -> float:
    """The grid's first tick after ``loop_time``."""
    return (math.floor(loop_time / window) + 1) * window
