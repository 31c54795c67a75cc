"""Room frames: ``join`` and ``leave`` (docs/websocket.md), registered in the socket's frame
registry (:data:`presence.frames.FRAMES`); a connection's rooms renewed with its heartbeats and
left when it closes. The rooms a connection is in are the hub's registry's, their joins and
leaves presence.rooms.live's; the consumer charges a join what its read cost."""

from __future__ import annotations

import time

from presence.consumers.limits import join_cost
from presence.consumers.state import Socket
from presence.domain.protocol import Join, Leave
from presence.frames import FRAMES


@FRAMES.handles(Join)
async def join_frame(socket: Socket, message: Join) -> None:
    resolved = await socket.hub.rooms.rooms_of(socket).join(message.room, message.meta)
    # Charged by the work its read did: a viewer who may see few members makes it resolve
    # up to 32 x ROOM_LIST_LIMIT members (docs/rooms.md).
    if (cost := join_cost(resolved)) > 1 and socket.attached:
        socket.state.rate.charge(time.time(), cost - 1)


@FRAMES.handles(Leave)
async def leave_frame(socket: Socket, message: Leave) -> None:
    rooms = socket.hub.registry.rooms.joined_by(socket)
    if rooms is not None:
        await rooms.leave(message.room)


async def renew(socket: Socket) -> None:
    """A heartbeat was written: the connection's stay in its rooms is renewed with it."""
    rooms = socket.hub.registry.rooms.joined_by(socket)
    if rooms is not None:
        await rooms.renew()


async def leave_all(socket: Socket) -> None:
    """The connection closes (the hub let it go): it leaves its rooms (its user stays
    OFFLINE_GRACE in those where it was their last connection; a deleted user leaves at
    once), which are no longer the registry's."""
    rooms = socket.hub.registry.rooms.release(socket)
    if rooms is not None:
        await rooms.leave_rooms(at_once=socket.state.account_deleted)
