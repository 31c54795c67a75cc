"""Room frames: ``join``, ``leave``, ``room_more``, ``watch_room_count`` and
``unwatch_room_count`` (docs/websocket.md), registered in the
socket's frame registry (:data:`presence.frames.FRAMES`); a connection's rooms renewed with its
heartbeats and left when it closes. The rooms a connection is in are the hub's registry's,
their joins and leaves presence.rooms.live's, a room's pages presence.rooms.paging's; the
consumer charges a join or a page what its read cost."""

from __future__ import annotations

import time

from django.core.exceptions import PermissionDenied
from django.utils.translation import gettext

from presence.consumers.limits import join_cost
from presence.consumers.state import Socket
from presence.domain import InvalidInput
from presence.domain.protocol import Join, Leave, RoomMore, UnwatchRoomCount, WatchRoomCount
from presence.frames import FRAMES
from presence.rooms.cards import add_cards
from presence.rooms.paging import aread_room_page
from presence.rooms.rule import UnknownRoom
from presence.store import StoreUnavailable


@FRAMES.handles(Join)
async def join_frame(socket: Socket, message: Join) -> None:
    # Its opening is done once it joins: the join goes in its room's batch (presence.rooms.joins),
    # whose work grows little with each joiner more, so the next socket opens meanwhile. A
    # socket that only joins rooms (a live event's page) held its place for OPENING_HOLD (a
    # process let 1,000 of them in 24 per 2 s), then until its room_state (each batch of joins
    # as small as the places, a window's delivery to every viewer each).
    socket.snapshot_sent()
    resolved = await socket.hub.rooms.rooms_of(socket).join(message.room, message.meta)
    # Charged by the work its read did: a viewer who may see few members makes it resolve
    # up to 32 x ROOM_LIST_LIMIT members (docs/rooms.md).
    if (cost := join_cost(resolved)) > 1 and socket.attached:
        socket.state.rate.charge(time.time(), cost - 1)


@FRAMES.handles(RoomMore)
async def room_more_frame(socket: Socket, message: RoomMore) -> None:
    """The next page of a room's members: ``room_page``, or an error naming the room (a bad
    cursor, the rule's refusal, an outage). The room's rule is asked as for a join; the
    connection need not be in the room (a page is what the room's HTTP answer gives)."""
    name = message.room.name
    try:
        state, resolved = await aread_room_page(message.room, socket.user, message.after)
    except (InvalidInput, UnknownRoom) as error:
        await socket.send_error(error.code, error.message, room=name)
        return
    except PermissionDenied:
        await socket.send_error(
            "forbidden", gettext("You may not enter the room %(room)s.") % {"room": name}, room=name
        )
        return
    except StoreUnavailable:
        await socket.send_error(
            "unavailable",
            gettext("The room %(room)s cannot be read right now; ask for the page again shortly.")
            % {"room": name},
            room=name,
        )
        return
    frame = {"type": "room_page", **state.as_dict()}
    await add_cards([frame["members"]])
    await socket.send_json(frame)
    # Charged as a join is: by the members whose facts its read resolved.
    if (cost := join_cost(resolved)) > 1 and socket.attached:
        socket.state.rate.charge(time.time(), cost - 1)


@FRAMES.handles(Leave)
async def leave_frame(socket: Socket, message: Leave) -> None:
    rooms = socket.hub.registry.rooms.joined_by(socket)
    if rooms is not None:
        await rooms.leave(message.room)


@FRAMES.handles(WatchRoomCount)
async def watch_room_count_frame(socket: Socket, message: WatchRoomCount) -> None:
    """The room's count as the user may see it (``room_count``), then its changes; the room is
    not joined (presence.hub.room_counts). Its rule is asked as for a join."""
    await socket.hub.rooms.counts.watch(socket, message.room)


@FRAMES.handles(UnwatchRoomCount)
async def unwatch_room_count_frame(socket: Socket, message: UnwatchRoomCount) -> None:
    await socket.hub.rooms.counts.unwatch(socket, message.room)


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
