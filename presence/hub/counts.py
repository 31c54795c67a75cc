"""The site's online count, live, for the connections that asked for it (``watch_count``, sent
by presence.js only on pages that show ``{% online_count %}``).

The count is read once per COUNT_INTERVAL per process, whatever the number of connections
watching it (one shared reading: a socket asking meanwhile is answered from it), and sent to a
connection only when it changed since what that connection was last sent, and at most once per
COUNT_INTERVAL per connection, however many users come and go. Pages without a count cost
nothing: the loop runs only while some connection of the process watches the count.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass

from presence.api import COUNT_INTERVAL, alive_online_count
from presence.hub import sends
from presence.hub.registry import Connection

logger = logging.getLogger("presence")

#: how often the loop looks whether a reading or a connection's update is due (real seconds;
#: the interval itself is measured on time.time, the clock the rest of presence keeps)
TICK = 0.5


@dataclass(slots=True)
class _Sent:
    """What a connection was last sent (None: its first answer is on its way), and when."""

    count: int | None
    at: float


class OnlineCounts:
    """The connections of this process watching the online count, and its one reading."""

    def __init__(self, sending: sends.InOrder | None = None) -> None:
        self.watchers: dict[Connection, _Sent] = {}
        #: the loop's updates go through it (the hub's: after each connection's other frames,
        #: and no round held by a client that reads nothing)
        self.sending = sending if sending is not None else sends.InOrder()
        #: the last reading and when it was made (time.time)
        self.count: int | None = None
        self.read_at = -math.inf
        #: readings made (tests and benchmarks count them)
        self.readings = 0
        self._reading: asyncio.Future[int] | None = None
        self._task: asyncio.Task[None] | None = None

    async def watch(self, connection: Connection) -> None:
        """Send ``connection`` the count now, then its changes (again: the count now)."""
        # Marked as sent now: the loop leaves it alone until COUNT_INTERVAL after this answer.
        self.watchers[connection] = _Sent(None, time.time())
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        count = await self.current()
        if connection not in self.watchers:
            return  # unwatched or closed meanwhile
        self.watchers[connection] = _Sent(count, time.time())
        await connection.send_json({"type": "online_count", "count": count})

    def discard(self, connection: Connection) -> None:
        """``connection`` no longer watches the count (unwatch_count, or it closed)."""
        left = self.watchers.pop(connection, None) is not None
        if left and not self.watchers and self._task is not None:
            self._task.cancel()
            self._task = None

    async def current(self) -> int:
        """The count read within COUNT_INTERVAL, else read now; callers at the same moment
        share one reading."""
        now = time.time()
        if self.count is not None and 0 <= now - self.read_at < COUNT_INTERVAL:
            return self.count
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read(now))
        # Shielded: a watcher's handler cancelled meanwhile does not cancel the others' reading.
        return await asyncio.shield(self._reading)

    async def _read(self, now: float) -> int:
        try:
            count = await alive_online_count()
            self.readings += 1
            if count is None:
                # Redis cannot be read: the last reading stands (read again on the next tick;
                # the store skips Redis for RETRY_INTERVAL after a failure).
                return self.count or 0
            self.count, self.read_at = count, now
            return count
        finally:
            self._reading = None

    async def _run(self) -> None:
        while self.watchers:
            await asyncio.sleep(TICK)
            try:
                await self.send_due()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("Presence: updating the online count failed; retrying shortly")

    async def send_due(self) -> None:
        """Send the count to each watcher it changed for whose last update is at least
        COUNT_INTERVAL old (reading it first if the last reading is as old)."""
        now = time.time()
        due = [c for c, sent in self.watchers.items() if not 0 <= now - sent.at < COUNT_INTERVAL]
        if not due:
            return
        count = await self.current()
        now = time.time()
        told: dict[Connection, _Sent] = {}
        for connection in due:
            sent = self.watchers.get(connection)
            if sent is None or sent.count is None or sent.count == count:
                continue  # gone, its first answer on its way, or nothing new
            self.watchers[connection] = told[connection] = _Sent(count, now)
        frame = {"type": "online_count", "count": count}

        async def send_count(connection: Connection) -> None:
            # Looked at when it goes (it may have waited behind a held send): not after an
            # unwatch, nor after a newer count (a later update, or a watch again's answer,
            # which goes at once: this one would undo it).
            if self.watchers.get(connection) is told[connection]:
                await connection.send_json(frame)

        await self.sending.send(told, send_count, "the online count")
