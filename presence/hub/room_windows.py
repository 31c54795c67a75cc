"""Rooms' coalescing windows (presence.hub.rooms): a room's changes are gathered for
COALESCE_WINDOW from the first one, and a room is delivered at most once per window (late
announcements wait for the next)."""

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


class RoomWindows:
    """The rooms with changes to deliver, and when."""

    def __init__(self) -> None:
        #: room -> (changed users, loop time its window ends)
        self.pending: dict[str, tuple[set[UserId], float]] = {}
        #: the room being delivered now, if any
        self.delivering: str | None = None
        #: room -> loop time its last delivery began (the next one waits a window after it)
        self.delivered_at: dict[str, float] = {}
        #: room -> the connections its pending delivery is for, when not every one in it: the
        #: views being read when its changes were delivered (the others were sent them)
        self.only: dict[str, set[Any]] = {}
        #: the connections the delivery under way is for (None: every one in the room)
        self.delivering_to: set[Any] | None = None
        self._wake = asyncio.Event()

    def changed(self, room: str, user_ids: Iterable[UserId], announced_at: float | None) -> None:
        """Users joined, left or changed in ``room``: delivered after its coalescing window
        (counted from ``announced_at``, as presence diffs are)."""
        loop_now = asyncio.get_running_loop().time()
        full = window = get_settings().COALESCE_WINDOW
        if announced_at is not None:
            window -= min(max(time.time() - announced_at, 0.0), window)
        # At most one delivery per window: announcements that arrive late (a busy channel
        # layer) would otherwise each be delivered at once, a frame per join in a burst.
        after_last = self.delivered_at.get(room, -math.inf) + full
        users, due = self.pending.get(room, (set(), max(loop_now + window, after_last)))
        users.update(user_ids)
        self.pending[room] = (users, due)
        self.only.pop(room, None)  # news: for every connection in the room
        self._wake.set()

    def again(
        self, room: str, user_ids: set[UserId], after: float, only: set[Any] | None = None
    ) -> None:
        """Deliver these users of ``room`` again, ``after`` seconds from now at the latest: to
        the connections ``only`` (None: to every one in the room)."""
        pending = self.pending.get(room)
        if only is None:
            self.only.pop(room, None)
        elif pending is None:
            self.only[room] = set(only)
        elif room in self.only:
            self.only[room] |= only
        # (else the room's pending delivery is for every connection already)
        users, due = pending or (set(), asyncio.get_running_loop().time() + after)
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
            due = [room for room, (_, at) in self.pending.items() if at <= now + 0.005]
            if not due:
                self._wake.clear()
                soonest = min(at for _, at in self.pending.values())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), soonest - now)
                continue
            for room in due:
                users, _ = self.pending.pop(room)
                self.delivering = room
                self.delivering_to = self.only.pop(room, None)
                self.delivered_at[room] = loop.time()
                try:
                    await deliver(room, users)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("Presence: delivering a room's changes failed; retrying")
                    retry(room, users)
                finally:
                    self.delivering, self.delivering_to = None, None
