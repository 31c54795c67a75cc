"""The consumer at ``ws/presence/``, composed of its rooms: connecting and disconnecting are
here; frames, credentials and sending are the mixins'."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from typing import Any

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer

from presence import admission, lifecycle, metrics, sessions, users
from presence.conf import get_settings
from presence.consumers.limits import (
    CLOSE_FOREIGN_ORIGIN,
    CLOSE_TOO_MANY_CONNECTIONS,
    CLOSE_UNAUTHENTICATED,
    RateLimit,
)
from presence.consumers.rooms import RoomFrames
from presence.consumers.scope import device_of, opened_from_foreign_origin
from presence.consumers.tidy import tidy_database_connections
from presence.domain import UserId
from presence.hub import Hub

logger = logging.getLogger("presence")

#: where in its first interval a socket's first session check falls (see connect)
_draw = random.random


class PresenceConsumer(RoomFrames):
    """One WebSocket connection of an authenticated user (protocol: docs/websocket.md), a
    :class:`presence.hub.Connection` of its process's hub. Frame types are added by rooms
    (mixins of :class:`~presence.consumers.frames.FrameDispatch` with ``@handles`` methods)."""

    # The process's hub is the one channel-layer listener; a connection needs no channel (and
    # no Redis receive) of its own. No such alias exists, so Channels gives it none.
    channel_layer_alias = "presence.hub-only"
    #: its place in the process's count of its user's sockets, until it ends (presence.admission)
    entry: admission.Entry | None = None
    #: its place among the openings in progress until its first snapshot (presence.admission)
    opening: admission.Slot | None = None

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels (4.2+) closes old database connections before every message, in the one
        # thread all of the process's database calls share: a thread hop per heartbeat, queued
        # behind the others' queries. Done at most once per TIDY_INTERVAL per process here.
        kind = message["type"]
        if kind != "websocket.disconnect":
            # Not on a close: it would wait for that thread (a storm's queue) before signing off.
            await tidy_database_connections()
        if kind == "websocket.receive" and self.beat_quietly(message.get("text")):
            return  # the most common frame by far, handled at once
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {kind}")
        await handler(message)

    async def subscribe(
        self, ids: dict[UserId, int | str], since: str | None = None, stamped: bool = False
    ) -> None:
        try:
            await super().subscribe(ids, since, stamped)
        finally:
            if self.opening is not None:
                # Its first snapshot is out: the next socket waiting opens (presence.admission).
                self.opening.release()
                self.opening = None

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        # Channels' own then closes old database connections: a hop to the database thread,
        # queued behind every query of the process, that kept closed sockets' handlers past
        # the server's kill timeout in a storm. This consumer is in no group; dispatch tidies.
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._give_places_back()
            # Whatever ends the consumer (a handler's exception, a cancellation by the server,
            # a close without websocket.disconnect), it leaves the hub and Redis; shielded,
            # so that a second cancellation cannot cut the cleanup short.
            if self.attached:
                await asyncio.shield(self.disconnect(1011))

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()
        # Accepted first, so that browsers see the code (a refused handshake is only 1006).
        if opened_from_foreign_origin(self.scope):
            logger.info("Presence: closing a connection from a foreign origin")
            await self.close(code=CLOSE_FOREIGN_ORIGIN)
            return
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        conf = get_settings()
        self.user = user
        self.viewer_id = users.viewer_pk(user)
        self.connection_id = uuid.uuid4().hex[:16]
        self.device, device_error = device_of(self.scope)
        self.idle = False
        self.written_at = 0.0
        self.heartbeat_interval = conf.HEARTBEAT_INTERVAL
        self.limits = lifecycle.limits()
        self.rate = RateLimit(*conf.RATE_LIMIT)
        self.sent = {}
        self.snapshotting = set()
        self.spelling = {}
        # Sockets close with the session or token they were opened with (logout, password
        # change, deactivation, expiry; presence.sessions).
        self.credential = sessions.credential_of(self.scope)
        # The first check falls anywhere in the second half of the first interval: sockets
        # opened together (a deploy, a reconnect storm) must not all check at the same moment.
        self.session_checked = time.time() - conf.SESSION_CHECK_INTERVAL * _draw() / 2
        # Past MAX_CONNECTIONS_PER_USER in this process alone it is refused before it waits:
        # one account's sockets must not queue ahead of everyone's (presence.admission).
        self.entry = admission.enter(self.viewer_id)
        if self.entry is None:
            await self._too_many()
            return
        # Accepted already, it waits for its turn among the openings (a reconnect storm).
        self.opening = await self.entry.admit()
        self.hub = Hub.get()
        await self.hub.attach(self)
        self.attached = True
        metrics.CONNECTIONS.inc()
        if self.credential is None:
            opened = await lifecycle.aconnect(self.user, self.connection_id, self.device.value)
        else:
            # Recent logouts are read in the opening write's round trip; a socket closed for
            # one is signed off again at once (disconnect).
            opened, (ended, changed) = await lifecycle.aconnect_checking(
                self.user, self.connection_id, self.device.value, self.recent_ends_check()
            )
            if await self._ended_meanwhile(ended, changed):
                self._give_places_back()
                return
        if opened is not None and opened.refused:
            # The next socket in turn opens now, not once this one's close is answered.
            self._give_places_back()
        if device_error:
            await self.send_error("invalid_value", device_error)
        if await self._refused(opened):
            return
        self.written_at = time.time()

    async def _too_many(self) -> None:
        logger.info("Presence: closing connection of user %s: too many connections", self.viewer_id)
        await self.close(code=CLOSE_TOO_MANY_CONNECTIONS)

    def _give_places_back(self) -> None:
        """Its place among the openings and in its user's count: the socket is closing."""
        if self.opening is not None:
            self.opening.release()
            self.opening = None
        if self.entry is not None:
            self.entry.leave()
            self.entry = None

    async def disconnect(self, code: int) -> None:
        if not self.attached:
            return
        self.attached = False
        metrics.CONNECTIONS.dec()
        try:
            await self.hub.detach(self)
        except Exception:
            logger.exception("Presence: detaching a connection of user %s failed", self.viewer_id)
        try:
            await self.leave_rooms()
        except Exception:
            logger.exception("Presence: leaving the rooms of user %s failed", self.viewer_id)
        try:
            # Bounded: servers kill a closed socket's handler that outlives its close (daphne
            # after 10 s, logging each). The Redis write goes on shielded; a sign-off cut short
            # before it lands is crash detection's (CONNECTION_TTL, the sweep).
            async with asyncio.timeout(get_settings().LIVE_SOCKET_TIMEOUT):
                await lifecycle.adisconnect(self.user, self.connection_id)
        except TimeoutError:
            logger.info(
                "Presence: signing off a connection of user %s took over LIVE_SOCKET_TIMEOUT; "
                "left to the sweep",
                self.viewer_id,
            )
        except Exception:
            logger.exception("Presence: signing off a connection of user %s failed", self.viewer_id)
