"""Room frames: ``join`` and ``leave`` (docs/websocket.md), a connection's rooms renewed with
its heartbeats, and left when it closes."""

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
from presence.consumers.frames import handles
from presence.consumers.handlers import PresenceFrames
from presence.consumers.limits import join_cost
from presence.domain.protocol import Join, Leave
from presence.domain.rooms import Room, RoomState, parse_room
from presence.store import StoreUnavailable

logger = logging.getLogger("presence")


class RoomFrames(PresenceFrames):
    """A connection's rooms: ``rooms`` maps each room it is in to its meta there."""

    rooms: dict[str, str | None]
    #: whether the user was invisible when the rooms were last written (their flag there)
    rooms_invisible: bool
    #: held by whatever reads or writes the rooms' invisible flag or takes a room away (a
    #: join, a renewal, recheck_rooms, a refusal by the rule): a flag read before a change must
    #: not be written after the flag that change wrote, nor a refused room renewed after
    rooms_lock: asyncio.Lock

    def _room_state_init(self) -> None:
        if not hasattr(self, "rooms"):
            self.rooms = {}
            self.rooms_invisible = False
            self.rooms_lock = asyncio.Lock()

    @handles(Join)
    async def join_frame(self, message: Join) -> None:
        self._room_state_init()
        # From the read of the joiner's own facts (their invisible flag) to the write: a
        # recheck_rooms for a change made meanwhile waits, then writes the flag it reads.
        async with self.rooms_lock:
            await self._join(message)

    async def _join(self, message: Join) -> None:
        room = message.room
        name = room.name
        first = name not in self.rooms
        if first and len(self.rooms) >= get_settings().MAX_ROOMS:
            raise domain.InvalidInput(
                "too_many_rooms",
                gettext("A connection may be in at most %(limit)d rooms; leave one first.")
                % {"limit": get_settings().MAX_ROOMS},
            )
        try:
            room_rule(room)
        except UnknownRoom as error:
            raise domain.InvalidInput(error.code, error.message) from None
        # A first join puts the connection in the room's channel-layer group while the
        # database is asked (the room's rule, the joiner's ties and own facts, in one trip:
        # a join again, answered from the connection's view, needs no facts);
        # nothing is sent for the room before its room_state, and a refusal takes it out again.
        entering = (
            asyncio.ensure_future(self.hub.rooms.enter(self, name))
            if first and self.attached
            else None
        )
        try:
            entry = await aroom_entry(self.user, room, own=first)
        except BaseException:
            await asyncio.shield(self._not_entered(entering, name))
            raise
        if not entry.allowed or not self.attached:
            await self._not_entered(entering, name)
            if not entry.allowed:
                raise domain.InvalidInput(
                    "forbidden", gettext("You may not enter the room %(room)s.") % {"room": name}
                )
            return
        before = self.rooms.get(name)
        self.rooms[name] = message.meta
        resolved = 0
        try:
            # A join again that replaces the meta is answered from the connection's view.
            state = None if first else await self._rejoined(room, message.meta)
            if state is None:
                await (entering if entering is not None else self.hub.rooms.enter(self, name))
            if first and len(self.rooms) == 1:
                self.rooms_invisible = entry.invisible(self.viewer_id)
            # Live: a busy Redis is waited for (back-pressure), an outage told (unavailable).
            if state is None:
                state, resolved = await ajoin_room_state(
                    room, self.user, self.connection_id, message.meta, self.rooms_invisible, entry
                )
            # The listed members' cards, before the view is shown: no diff may precede it.
            frame = {"type": "room_state", **state.as_dict()}
            await add_cards([frame["members"]])
        except BaseException as failure:
            if first:
                # Nothing of a failed join stays.
                self.rooms.pop(name, None)
                await asyncio.shield(self._forget_room(room, linger=False))
            else:
                self.rooms[name] = before  # joined before: stays with its meta of then
            if isinstance(failure, StoreUnavailable):
                # An outage: the client learns the room could not be read (an empty room_state
                # would say nobody is here) and may join again once Redis is back.
                await self.send_error(
                    "unavailable",
                    gettext("The room %(room)s cannot be read right now; join again shortly.")
                    % {"room": name},
                    room=name,
                )
                return
            raise
        self.hub.rooms.show(self, name, state)
        await self.send_json(frame)
        # Charged by the work its read did: a viewer who may see few members makes it resolve
        # up to 32 x ROOM_LIST_LIMIT members (docs/rooms.md).
        if (cost := join_cost(resolved)) > 1 and self.attached:
            self.rate.charge(time.time(), cost - 1)

    async def _rejoined(self, room: Room, meta: str | None) -> RoomState | None:
        """A join of a room the connection is in: its new meta written (and announced), and
        the room as the connection's view has it, not read again; None while the view is being
        read (the caller reads the room)."""
        state = self.hub.rooms.rejoining(self, room.name, meta)
        if state is not None:
            try:
                written = await events.ajoin_room(
                    self.user, self.connection_id, room, meta, self.rooms_invisible
                )
            except BaseException:
                self.hub.rooms.resume(self, room.name)
                raise
            if written is None:
                self.hub.rooms.resume(self, room.name)
                raise StoreUnavailable("Redis is unavailable: the join was not written")
        return state

    async def _not_entered(self, entering: asyncio.Future[Any] | None, name: str) -> None:
        """A first join refused or failed before its write: out of the room's group again."""
        if entering is None:
            return
        with contextlib.suppress(Exception):
            await entering
        await self.hub.rooms.exit(self, name, linger=False)

    @handles(Leave)
    async def leave_frame(self, message: Leave) -> None:
        self._room_state_init()
        if message.room.name not in self.rooms:
            return  # a room never joined (or left already): nothing to do
        del self.rooms[message.room.name]
        await self._forget_room(message.room)

    async def _forget_room(self, room: Room, linger: bool = True) -> None:
        # The view goes and the leave is written at once: neither waits for the other.
        await asyncio.gather(
            self.hub.rooms.exit(self, room.name, linger),
            events.aleave_rooms(self.user, self.connection_id, [room]),
        )

    async def heartbeat(self, message: domain.Heartbeat) -> None:
        """A heartbeat that was written renews the connection's stay in its rooms."""
        written_at = self.written_at
        await super().heartbeat(message)
        self._room_state_init()
        if self.rooms and self.attached and self.written_at != written_at:
            async with self.rooms_lock:
                if self.rooms and self.attached:
                    await events.arenew_rooms(
                        self.user, self.connection_id, dict(self.rooms), self.rooms_invisible
                    )

    async def recheck_rooms(self) -> None:
        """What others may see of this user changed (the hub asks): the invisible flag of the
        connection's rooms follows the user's choice."""
        self._room_state_init()
        async with self.rooms_lock:  # after a join under way, which may have read the flag
            if not self.rooms or not self.attached:
                return
            invisible = await events.ais_invisible(self.viewer_id)
            if invisible != self.rooms_invisible:
                self.rooms_invisible = invisible
                await events.arenew_rooms(
                    self.user, self.connection_id, dict(self.rooms), invisible
                )

    async def drop_room(self, name: str) -> bool:
        """The room's rule refused this connection's user (presence.hub.room_rules): the room
        and its view are no longer the connection's, once a join or renewal under way is
        written (the caller then writes the leave). False if the connection was not in it."""
        self._room_state_init()
        async with self.rooms_lock:
            if name not in self.rooms:
                return False
            del self.rooms[name]
            await self.hub.rooms.exit(self, name)
            return True

    async def tell_refused(self, name: str) -> None:
        """Tell the client it was taken out of the room: the rule no longer lets its user in.
        The connection stays open, in its other rooms."""
        await self.send_error(
            "forbidden",
            gettext("You may no longer be in the room %(room)s.") % {"room": name},
            room=name,
        )

    async def leave_rooms(self) -> None:
        """The connection closes: it leaves its rooms (its user stays OFFLINE_GRACE in those
        where it was their last connection; a deleted user leaves at once)."""
        rooms: dict[str, Any] = getattr(self, "rooms", {})
        if not rooms:
            return
        names = [parse_room(name) for name in rooms]
        rooms.clear()
        await events.aleave_rooms(
            self.user, self.connection_id, names, at_once=self.account_deleted
        )
