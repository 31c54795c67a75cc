"""Room frames: ``join`` and ``leave`` (docs/websocket.md), registered in the socket's frame
registry (:data:`presence.frames.FRAMES`); a connection's rooms (``state.rooms``) renewed with
its heartbeats, rechecked and refused as the hub asks, and left when it closes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from django.utils.translation import gettext

from presence import domain
from presence.api import UnknownRoom
from presence.api import _room_events as events
from presence.api._cards import add_cards
from presence.api._rooms import ajoin_room_state, aroom_entry, room_rule
from presence.conf import get_settings
from presence.consumers.limits import join_cost
from presence.consumers.state import Socket
from presence.domain.protocol import Join, Leave
from presence.domain.rooms import Room, RoomState, parse_room
from presence.frames import FRAMES
from presence.store import StoreUnavailable

logger = logging.getLogger("presence")


@FRAMES.handles(Join)
async def join_frame(socket: Socket, message: Join) -> None:
    # From the read of the joiner's own facts (their invisible flag) to the write: a
    # recheck for a change made meanwhile waits, then writes the flag it reads.
    async with socket.state.rooms.lock:
        await _join(socket, message)


async def _join(socket: Socket, message: Join) -> None:
    held = socket.state.rooms
    rooms = held.names
    room = message.room
    name = room.name
    first = name not in rooms
    if first and len(rooms) >= get_settings().MAX_ROOMS:
        raise domain.InvalidInput(
            "too_many_rooms",
            gettext("A connection may be in at most %(limit)d rooms; leave one first.")
            % {"limit": get_settings().MAX_ROOMS},
        )
    try:
        room_rule(room)
    except UnknownRoom as error:
        raise domain.InvalidInput(error.code, error.message) from None
    hub = socket.hub
    # A first join puts the connection in the room's channel-layer group while the
    # database is asked (the room's rule, the joiner's ties and own facts, in one trip:
    # a join again, answered from the connection's view, needs no facts);
    # nothing is sent for the room before its room_state, and a refusal takes it out again.
    entering = (
        asyncio.ensure_future(hub.rooms.enter(socket, name)) if first and socket.attached else None
    )
    try:
        entry = await aroom_entry(socket.user, room, own=first)
    except BaseException:
        await asyncio.shield(_not_entered(socket, entering, name))
        raise
    if not entry.allowed or not socket.attached:
        await _not_entered(socket, entering, name)
        if not entry.allowed:
            raise domain.InvalidInput(
                "forbidden", gettext("You may not enter the room %(room)s.") % {"room": name}
            )
        return
    before = rooms.get(name)
    rooms[name] = message.meta
    resolved = 0
    try:
        # A join again that replaces the meta is answered from the connection's view.
        state = None if first else await _rejoined(socket, room, message.meta)
        if state is None:
            await (entering if entering is not None else hub.rooms.enter(socket, name))
        if first and len(rooms) == 1:
            held.invisible = entry.invisible(socket.viewer_id)
        # Live: a busy Redis is waited for (back-pressure), an outage told (unavailable).
        if state is None:
            state, resolved = await ajoin_room_state(
                room, socket.user, socket.connection_id, message.meta, held.invisible, entry
            )
        # The listed members' cards, before the view is shown: no diff may precede it.
        frame = {"type": "room_state", **state.as_dict()}
        await add_cards([frame["members"]])
    except BaseException as failure:
        if first:
            # Nothing of a failed join stays.
            rooms.pop(name, None)
            await asyncio.shield(_forget_room(socket, room, linger=False))
        else:
            rooms[name] = before  # joined before: stays with its meta of then
        if isinstance(failure, StoreUnavailable):
            # An outage: the client learns the room could not be read (an empty room_state
            # would say nobody is here) and may join again once Redis is back.
            await socket.send_error(
                "unavailable",
                gettext("The room %(room)s cannot be read right now; join again shortly.")
                % {"room": name},
                room=name,
            )
            return
        raise
    hub.rooms.show(socket, name, state)
    await socket.send_json(frame)
    # Charged by the work its read did: a viewer who may see few members makes it resolve
    # up to 32 x ROOM_LIST_LIMIT members (docs/rooms.md).
    if (cost := join_cost(resolved)) > 1 and socket.attached:
        socket.state.rate.charge(time.time(), cost - 1)


async def _rejoined(socket: Socket, room: Room, meta: str | None) -> RoomState | None:
    """A join of a room the connection is in: its new meta written (and announced), and the
    room as the connection's view has it, not read again; None while the view is being read
    (the caller reads the room)."""
    views = socket.hub.rooms
    state = views.rejoining(socket, room.name, meta)
    if state is not None:
        try:
            written = await events.ajoin_room(
                socket.user, socket.connection_id, room, meta, socket.state.rooms.invisible
            )
        except BaseException:
            views.resume(socket, room.name)
            raise
        if written is None:
            views.resume(socket, room.name)
            raise StoreUnavailable("Redis is unavailable: the join was not written")
    return state


async def _not_entered(socket: Socket, entering: asyncio.Future[Any] | None, name: str) -> None:
    """A first join refused or failed before its write: out of the room's group again."""
    if entering is None:
        return
    with contextlib.suppress(Exception):
        await entering
    await socket.hub.rooms.exit(socket, name, linger=False)


@FRAMES.handles(Leave)
async def leave_frame(socket: Socket, message: Leave) -> None:
    rooms = socket.state.rooms.names
    if message.room.name not in rooms:
        return  # a room never joined (or left already): nothing to do
    del rooms[message.room.name]
    await _forget_room(socket, message.room)


async def _forget_room(socket: Socket, room: Room, linger: bool = True) -> None:
    # The view goes and the leave is written at once: neither waits for the other.
    await asyncio.gather(
        socket.hub.rooms.exit(socket, room.name, linger),
        events.aleave_rooms(socket.user, socket.connection_id, [room]),
    )


async def renew(socket: Socket) -> None:
    """A heartbeat was written: the connection's stay in its rooms is renewed with it."""
    held = socket.state.rooms
    if held.names and socket.attached:
        async with held.lock:
            if held.names and socket.attached:
                await events.arenew_rooms(
                    socket.user, socket.connection_id, dict(held.names), held.invisible
                )


async def recheck(socket: Socket) -> None:
    """What others may see of this user changed (the hub asks): the invisible flag of the
    connection's rooms follows the user's choice."""
    held = socket.state.rooms
    async with held.lock:  # after a join under way, which may have read the flag
        if not held.names or not socket.attached:
            return
        invisible = await events.ais_invisible(socket.viewer_id)
        if invisible != held.invisible:
            held.invisible = invisible
            await events.arenew_rooms(
                socket.user, socket.connection_id, dict(held.names), invisible
            )


async def drop(socket: Socket, name: str) -> bool:
    """The room's rule refused this connection's user (presence.hub.room_rules): the room and
    its view are no longer the connection's, once a join or renewal under way is written (the
    caller then writes the leave). False if the connection was not in it."""
    held = socket.state.rooms
    async with held.lock:
        if name not in held.names:
            return False
        del held.names[name]
        await socket.hub.rooms.exit(socket, name)
        return True


async def tell_refused(socket: Socket, name: str) -> None:
    """Tell the client it was taken out of the room: the rule no longer lets its user in. The
    connection stays open, in its other rooms."""
    await socket.send_error(
        "forbidden",
        gettext("You may no longer be in the room %(room)s.") % {"room": name},
        room=name,
    )


async def leave_all(socket: Socket) -> None:
    """The connection closes: it leaves its rooms (its user stays OFFLINE_GRACE in those where
    it was their last connection; a deleted user leaves at once)."""
    rooms = socket.state.rooms.names
    if not rooms:
        return
    names = [parse_room(name) for name in rooms]
    rooms.clear()
    await events.aleave_rooms(
        socket.user, socket.connection_id, names, at_once=socket.state.account_deleted
    )
