"""Room frames: ``join`` and ``leave`` (docs/websocket.md), a connection's rooms renewed with
its heartbeats, and left when it closes. The rooms are the hub's registry's, their joins and
leaves presence.rooms.live's; the consumer charges a join what its read cost."""

from __future__ import annotations

import time

from presence import domain
from presence.consumers.frames import handles
from presence.consumers.handlers import PresenceFrames
from presence.consumers.limits import join_cost
from presence.domain.protocol import Join, Leave


class RoomFrames(PresenceFrames):
    """A connection's room frames."""

    @handles(Join)
    async def join_frame(self, message: Join) -> None:
        resolved = await self.hub.rooms.rooms_of(self).join(message.room, message.meta)
        # Charged by the work its read did: a viewer who may see few members makes it resolve
        # up to 32 x ROOM_LIST_LIMIT members (docs/rooms.md).
        if (cost := join_cost(resolved)) > 1 and self.attached:
            self.rate.charge(time.time(), cost - 1)

    @handles(Leave)
    async def leave_frame(self, message: Leave) -> None:
        rooms = self.hub.registry.rooms.joined_by(self)
        if rooms is not None:
            await rooms.leave(message.room)

    async def heartbeat(self, message: domain.Heartbeat) -> None:
        """A heartbeat that was written renews the connection's stay in its rooms."""
        written_at = self.written_at
        await super().heartbeat(message)
        rooms = self.hub.registry.rooms.joined_by(self)
        if rooms is not None and self.written_at != written_at:
            await rooms.renew()

    async def leave_rooms(self) -> None:
        """The connection closes: it leaves its rooms (its user stays OFFLINE_GRACE in those
        where it was their last connection; a deleted user leaves at once)."""
        rooms = self.hub.registry.rooms.release(self)
        if rooms is not None:
            await rooms.leave_rooms()
