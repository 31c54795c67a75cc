"""Rooms' coalescing windows (presence.hub.rooms, presence.hub.room_counts): a room's changes
are delivered at the first tick after them of the process's one grid, a tick every
COALESCE_WINDOW of the event loop's clock, so a room is delivered at most once per window.

Why a grid, not a window opened by a room's first change: a viewer's frame must come at a
time that depends only on changes it may see (a blocked or invisible member's coming and going
tells it nothing, not even through when its next frame comes). A window opened by the first
change would be opened by a member the viewer may not see as well, and the visible join that
follows would reach it sooner. On the grid a change is delivered at the first tick after it,
whatever else changed: a hidden change only has a room read at a tick, where any change the
viewer may see made before it was due anyway (and none made after it is read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from presence.conf import get_settings
from presence.domain import UserId

logger = logging.getLogger("presence")


def next_tick(
    changed_at: float | None = None, last_tick: float = -math.inf, after: float = 0.0
) -> float:
    """The loop time a room's change is delivered at: the first tick of the grid (every
    COALESCE_WINDOW of the loop's clock) after the change, made at ``changed_at`` (wall clock,
    as its announcement says; None: now) or ``after`` seconds from now, and a window after the
    room's last delivery (``last_tick``) at least."""
    window = get_settings().COALESCE_WINDOW
    loop_now = asyncio.get_running_loop().time()
    if window <= 0:
        return loop_now + after
    # Counted from when the change was made, as presence diffs are: not from its arrival.
    made = loop_now + after
    if changed_at is not None:
        made -= max(time.time() - changed_at, 0.0)
    tick = (math.floor(made / window) + 1) * window
    if tick < loop_now:  # announced late (a busy channel layer): the next tick, on the grid
        tick = (math.floor(loop_now / window) + 1) * window
    return max(tick, last_tick + window)


def tick_by(after: float, last_tick: float = -math.inf) -> float:
    """The loop time of a delivery wanted ``after`` seconds from now at the latest: the last
    tick at or before then (the next tick, if ``after`` is shorter than a window), and a window
    after the last delivery (``last_tick``) at least. The first tick after now + ``after``
    would be up to a window later than asked."""
    window = get_settings().COALESCE_WINDOW
    return next_tick(last_tick=last_tick, after=max(after - window, 0.0))


def is_due(tick: float, loop_now: float) -> bool:
    """Whether a delivery at ``tick`` is due at ``loop_now``: not a moment before. A delivery
    read early (woken by another change in the last milliseconds) would be recorded at its
    tick while missing a change made before that tick, which then waits a whole window: only
    if a hidden change had it pending, so a viewer would see that change in the timing."""
    return tick <= loop_now


class RoomWindows:
    """The rooms with changes to deliver, and when."""

    def __init__(self) -> None:
        #: room -> (changed users, the tick it is delivered at: loop time)
        self.pending: dict[str, tuple[set[UserId], float]] = {}
        #: the room being delivered now, if any
        self.delivering: str | None = None
        #: room -> the tick of its last delivery (the next one is a window after it at least)
        self.delivered_at: dict[str, float] = {}
        #: room -> the connections its pending delivery is for, when not every one in it: the
        #: views being read when its changes were delivered (the others were sent them)
        self.only: dict[str, set[Any]] = {}
        #: the connections the delivery under way is for (None: every one in the room)
        self.delivering_to: set[Any] | None = None
        self._wake = asyncio.Event()

    def changed(self, room: str, user_ids: Iterable[UserId], announced_at: float | None) -> None:
        """Users joined, left or changed in ``room``: delivered at the first tick after the
        change (made at ``announced_at``), at most once per window."""
        # At most one delivery per window: announcements that arrive late (a busy channel
        # layer) would otherwise each be delivered at once, a frame per join in a burst.
        tick = next_tick(announced_at, self.delivered_at.get(room, -math.inf))
        users, due = self.pending.get(room, (set(), tick))
        users.update(user_ids)
        self.pending[room] = (users, min(due, tick))
        self.only.pop(room, None)  # news: for every connection in the room
        self._wake.set()

    def again(
        self, room: str, user_ids: set[UserId], after: float, only: set[Any] | None = None
    ) -> None:
        """Deliver these users of ``room`` again, ``after`` seconds from now at the latest (at
        the last tick by then, a window after the room's last delivery at least): to the
        connections ``only`` (None: to every one in the room)."""
        pending = self.pending.get(room)
        if only is None:
            self.only.pop(room, None)
        elif pending is None:
            self.only[room] = set(only)
        elif room in self.only:
            self.only[room] |= only
        # (else the room's pending delivery is for every connection already)
        users, due = pending or (
            set(),
            tick_by(after, self.delivered_at.get(room, -math.inf)),
        )
        self.pending[room] = (users | user_ids, due)
        self._wake.set()

    def forget(self, room: str) -> None:
        """No connection here is in ``room`` any more: nothing of it to deliver."""
        self.pending.pop(room, None)
        self.delivered_at.pop(room, None)
        self.only.pop(room, None)

    async def run(
        self,
        running: Callable[[], bool],
        deliver: Callable[[str, set[UserId]], Awaitable[None]],
        retry: Callable[[str, set[UserId]], None],
    ) -> None:
        """``deliver`` each room when its window ends, while ``running()``; a delivery that
        fails is logged and ``retry``-ed."""
        loop = asyncio.get_running_loop()
        while running():
            if not self.pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = loop.time()
            due = [room for room, (_, at) in self.pending.items() if is_due(at, now)]
            if not due:
                self._wake.clear()
                soonest = min(at for _, at in self.pending.values())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), soonest - now)
                continue
            for room in due:
                # Looked up again: while an earlier room of this tick was delivered, this one
                # may have been forgotten (its last connection here left), or forgotten and
                # joined again with a change due at a later tick.
                entry = self.pending.get(room)
                if entry is None or not is_due(entry[1], now):
                    continue
                users, tick = self.pending.pop(room)
                self.delivering = room
                self.delivering_to = self.only.pop(room, None)
                self.delivered_at[room] = tick
                try:
                    await deliver(room, users)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("Presence: delivering a room's changes failed; retrying")
                    retry(room, users)
                finally:
                    self.delivering, self.delivering_to = None, None
