"""Rooms, live: one connection's rooms (the ``join`` and ``leave`` frames, docs/websocket.md),
renewed with its heartbeats, their invisible and public flags following its user's choices, a
room taken away when its rule refuses the user, and all of them left when the connection closes.

The hub's registry holds a connection's :class:`ConnectionRooms` (presence.hub.registry: the
one place that says which rooms a connection is in); what the connection was sent of each
room is the hub's room views' (presence.hub.rooms), handed in as ``views``. A join is written
and read here (presence.rooms.reading, presence.rooms.writes); a join that fails or is refused
takes back what it did: the room's group (:meth:`ConnectionRooms._not_entered`), its entry and
view (:meth:`ConnectionRooms._forget`), or a join again's paused view (``views.resume``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

from django.utils.translation import gettext

from presence import domain, metrics, relations
from presence.conf import get_settings
from presence.domain import UserId
from presence.domain.rooms import Room, RoomState, parse_room
from presence.rooms.cards import add_cards
from presence.rooms.joins import JoinBatches, Joining
from presence.rooms.rule import UnknownRoom, room_rule
from presence.rooms.writes import ajoin_room, aleave_refused, aleave_rooms, arenew_rooms
from presence.store import StoreUnavailable


class RoomConnection(Protocol):
    """What a connection's rooms need of the connection (the consumer)."""

    user: Any
    viewer_id: UserId
    connection_id: str
    #: in the hub and recorded in Redis (False once it closes)
    attached: bool

    async def send_json(self, content: dict[str, Any]) -> None: ...

    async def send_error(self, code: str, message: str, **extra: Any) -> None: ...


class Views(Protocol):
    """The hub's room views (presence.hub.rooms.RoomViews), as a connection's rooms use them."""

    #: the process's joins, written and read together per room (presence.rooms.joins)
    joins: JoinBatches

    async def enter(self, connection: Any, room: str) -> Any: ...

    def show(self, connection: Any, room: str, state: RoomState) -> None: ...

    def rejoining(self, connection: Any, room: str, meta: str | None) -> RoomState | None: ...

    def resume(self, connection: Any, room: str) -> None: ...

    def refresh_later(self, connection: Any, room: str) -> None: ...

    async def exit(self, connection: Any, room: str, linger: bool = True) -> None: ...


class ConnectionRooms:
    """The rooms of one connection: ``rooms`` maps each room it was let into to its meta there."""

    def __init__(self, connection: RoomConnection, views: Views) -> None:
        self.connection = connection
        self.views = views
        self.rooms: dict[str, str | None] = {}
        #: whether the user was invisible when the rooms were last written (their flag there)
        self.invisible = False
        #: whether the user showed their online status to everyone then (their flag there: the
        #: rooms' index of public members, which strangers' reads go through)
        self.public = True
        #: held by whatever reads or writes the rooms' invisible flag or takes a room away (a
        #: join, a renewal, recheck_rooms, a refusal by the rule): a flag read before a change
        #: must not be written after the flag that change wrote, nor a refused room renewed after
        self.lock = asyncio.Lock()

    @property
    def viewer_id(self) -> UserId:
        return self.connection.viewer_id

    # --- join ---

    async def join(self, room: Room, meta: str | None) -> int:
        """The ``join`` frame: the connection joins ``room`` (again: its meta replaced) and is
        sent the room's ``room_state``. How many members' facts its read resolved (what the
        join is charged); InvalidInput where it may not join."""
        # From the read of the joiner's own facts (their invisible flag) to the write: a
        # recheck_rooms for a change made meanwhile waits, then writes the flag it reads.
        async with self.lock:
            return await self._join(room, meta)

    async def _join(self, room: Room, meta: str | None) -> int:
        connection, views = self.connection, self.views
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
            asyncio.ensure_future(views.enter(connection, name))
            if first and connection.attached
            else None
        )
        try:
            # With the joins of the room made meanwhile here: one trip for all of them.
            entry = await views.joins.entry(connection.user, room, own=first)
        except BaseException:
            await asyncio.shield(self._not_entered(entering, name))
            raise
        if not entry.allowed and not first:
            # A join again the rule refuses: out of the room, as the rule's periodic pass takes
            # a refused member out (not left in it, sent its diffs and listed to the others).
            await self._refused_inside(name)
            return 0
        if not entry.allowed or not connection.attached:
            await self._not_entered(entering, name)
            if not entry.allowed:
                raise domain.InvalidInput(
                    "forbidden", gettext("You may not enter the room %(room)s.") % {"room": name}
                )
            return 0
        before = self.rooms.get(name)
        self.rooms[name] = meta
        resolved = 0
        #: a join again that reads the room anew (its view paused for the read)
        reading_anew = False
        try:
            # A join again that replaces the meta is answered from the connection's view.
            state = None if first else await self._rejoined(room, meta)
            if state is None:
                reading_anew = not first
                await (entering if entering is not None else views.enter(connection, name))
            if first and len(self.rooms) == 1:
                self.invisible = entry.invisible(connection.viewer_id)
                self.public = entry.public(connection.viewer_id)
            # Live: a busy Redis is waited for (back-pressure), an outage told (unavailable).
            # Joins of the room made meanwhile on this process go with it: one write and
            # read for all of them (a live event's room filling up).
            if state is None:
                joining = Joining(
                    connection.user,
                    connection.connection_id,
                    meta,
                    self.invisible,
                    entry,
                    self.public,
                )
                # With the listed members' cards, before the view is shown: no diff may
                # precede it.
                state, resolved, frame, text = await views.joins.join(room, joining)
            else:
                frame = {"type": "room_state", **state.as_dict()}
                await add_cards([frame["members"]])
                text = None
        except BaseException as failure:
            if first:
                # Nothing of a failed join stays.
                self.rooms.pop(name, None)
                await asyncio.shield(self._forget(room, linger=False))
            else:
                self.rooms[name] = before  # joined before: stays with its meta of then
                if reading_anew:
                    # Its view is delivered to again; a refresh under way read it before this
                    # join again and drops its read (a newer one was started): the view is
                    # read afresh at the next sweep.
                    views.resume(connection, name)
                    views.refresh_later(connection, name)
            if isinstance(failure, StoreUnavailable):
                # An outage: the client learns the room could not be read (an empty room_state
                # would say nobody is here) and may join again once Redis is back.
                await connection.send_error(
                    "unavailable",
                    gettext("The room %(room)s cannot be read right now; join again shortly.")
                    % {"room": name},
                    room=name,
                )
                return 0
            raise
        views.show(connection, name, state)
        send = getattr(connection, "send", None)
        if text is None or send is None:  # a connection of the hub's tests has no raw send
            await connection.send_json(frame)
        else:
            # The batch's frames share their members' parts: serialized once for all of them.
            metrics.frame_sent("room_state")
            await send(text_data=text)
        return resolved

    async def _rejoined(self, room: Room, meta: str | None) -> RoomState | None:
        """A join of a room the connection is in: its new meta written (and announced), and
        the room as the connection's view has it, not read again; None while the view is being
        read (the caller reads the room)."""
        connection, views = self.connection, self.views
        state = views.rejoining(connection, room.name, meta)
        if state is not None:
            try:
                written = await ajoin_room(
                    connection.user,
                    connection.connection_id,
                    room,
                    meta,
                    self.invisible,
                    self.public,
                )
            except BaseException:
                views.resume(connection, room.name)
                raise
            if written is None:
                views.resume(connection, room.name)
                raise StoreUnavailable("Redis is unavailable: the join was not written")
        return state

    async def _not_entered(self, entering: asyncio.Future[Any] | None, name: str) -> None:
        """A first join refused or failed before its write: out of the room's group again."""
        if entering is None:
            return
        with contextlib.suppress(Exception):
            await entering
        await self.views.exit(self.connection, name, linger=False)

    async def _refused_inside(self, name: str) -> None:
        """The rule refused a join of a room the connection is in (the lock held): the room
        and its view go, the leave is written at once (no OFFLINE_GRACE, the room told) and
        the client told, as presence.hub.room_rules does for a member refused later."""
        connection = self.connection
        del self.rooms[name]
        await self.views.exit(connection, name)
        await aleave_refused([(connection.viewer_id, connection.connection_id, name)])
        if connection.attached:
            await self.tell_refused(name)

    async def _forget(self, room: Room, linger: bool = True) -> None:
        # The view goes and the leave is written at once: neither waits for the other.
        connection = self.connection
        await asyncio.gather(
            self.views.exit(connection, room.name, linger),
            aleave_rooms(connection.user, connection.connection_id, [room]),
        )

    # --- leave, renewal, the user's choice, the rule ---

    async def leave(self, room: Room) -> None:
        """The ``leave`` frame (a room never joined, or left already: nothing to do)."""
        # After a join, renewal or recheck_rooms under way is written, as leave_rooms: a
        # renewal written after the leave would keep the connection its full stay.
        async with self.lock:
            if room.name not in self.rooms:
                return
            del self.rooms[room.name]
            await self._forget(room)

    async def renew(self) -> None:
        """A heartbeat was written: the connection's stay in its rooms is renewed."""
        connection = self.connection
        if self.rooms and connection.attached:
            async with self.lock:
                if self.rooms and connection.attached:
                    await arenew_rooms(
                        connection.user,
                        connection.connection_id,
                        dict(self.rooms),
                        self.invisible,
                        self.public,
                    )

    async def recheck_rooms(self) -> None:
        """What others may see of this user changed (the hub tells): the flags of the
        connection's rooms (invisible, public) follow the user's choices. A flag changed is
        announced to the room (arenew_rooms): the viewers' processes may have delivered the
        change before this write, and a viewer whose read went through the index of public
        members meanwhile did not consider the user."""
        connection = self.connection
        async with self.lock:  # after a join under way, which may have read the flags
            if not self.rooms or not connection.attached:
                return
            flags = await relations.ashown_flags(connection.viewer_id)
            if flags != (self.invisible, self.public):
                self.invisible, self.public = flags
                await arenew_rooms(
                    connection.user, connection.connection_id, dict(self.rooms), *flags
                )

    async def drop_room(self, name: str) -> bool:
        """The room's rule refused this connection's user (presence.hub.room_rules): the room
        and its view are no longer the connection's, once a join or renewal under way is
        written (the caller then writes the leave). False if the connection was not in it."""
        async with self.lock:
            if name not in self.rooms:
                return False
            del self.rooms[name]
            await self.views.exit(self.connection, name)
            return True

    async def tell_refused(self, name: str) -> None:
        """Tell the client it was taken out of the room: the rule no longer lets its user in.
        The connection stays open, in its other rooms."""
        await self.connection.send_error(
            "forbidden",
            gettext("You may no longer be in the room %(room)s.") % {"room": name},
            room=name,
        )

    async def leave_rooms(self, at_once: bool = False) -> None:
        """The connection closed (the hub let it go, and its registry these rooms): it leaves
        them (its user stays OFFLINE_GRACE in those where it was their last connection;
        ``at_once``, a deleted user's, they leave at once)."""
        connection = self.connection
        # After a join, renewal or recheck_rooms under way is written: a renewal written after
        # the leave would join its rooms again (a stay that ended is renewed as a join, for
        # crash detection), and a deleted user's at-once leave would be undone, them counted
        # until their connection's expiry. Those that come later find no room.
        async with self.lock:
            if not self.rooms:
                return
            names = [parse_room(name) for name in self.rooms]
            self.rooms.clear()
        await aleave_rooms(connection.user, connection.connection_id, names, at_once=at_once)
