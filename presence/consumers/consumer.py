"""The consumer at ``ws/presence/``: connecting and disconnecting are here; it holds its
connection's state (presence.consumers.state), its sending (a :class:`Sender`) and its
credential checks (a :class:`Credentials`); its frames go to the socket's frame registry."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from typing import Any

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer

from presence import admission, domain, lifecycle, metrics, sessions, users
from presence.conf import get_settings
from presence.consumers import frames, handlers, opening_request, rooms
from presence.consumers.credentials import Credentials
from presence.consumers.limits import (
    CLOSE_FOREIGN_ORIGIN,
    CLOSE_TOO_MANY_CONNECTIONS,
    CLOSE_UNAUTHENTICATED,
    RateLimit,
)
from presence.consumers.scope import (
    device_of,
    idle_of,
    opened_from_foreign_origin,
    opening_query,
)
from presence.consumers.sending import Sender
from presence.consumers.state import ConnectionState
from presence.consumers.tidy import tidy_database_connections
from presence.domain import UserId
from presence.hub import Hub
from presence.sessions import Credential
from presence.store import get_store

logger = logging.getLogger("presence")

#: where in its first interval a socket's first session check falls (see connect)
_draw = random.random


def _drop_turn(turn: asyncio.Future[admission.Slot]) -> None:
    """Give up a socket's place in the queue (Gate.admit), or the place it was given."""
    if not turn.done():
        turn.cancel()
    elif not turn.cancelled() and turn.exception() is None:
        turn.result().release()


class PresenceConsumer(AsyncWebsocketConsumer):
    """One WebSocket connection of an authenticated user (protocol: docs/websocket.md), a
    :class:`presence.hub.Connection` of its process's hub. Its frames are handled by the
    handlers of :data:`presence.frames.FRAMES`, which get it as a
    :class:`~presence.consumers.state.Socket`."""

    # The process's hub is the one channel-layer listener; a connection needs no channel (and
    # no Redis receive) of its own. No such alias exists, so Channels gives it none.
    channel_layer_alias = "presence.hub-only"
    #: its place in the process's count of its user's sockets, until it ends (presence.admission)
    entry: admission.Entry | None = None
    #: its place among the openings in progress until its first snapshot (presence.admission)
    opening: admission.Slot | None = None
    #: in the hub and recorded in Redis: frames are handled, and closing it has to clean up
    attached: bool = False
    #: recorded in Redis while it waited for its turn (not attached yet): closing it signs off
    recorded: bool = False

    # Who the connection was opened for, and with what; its state, set by ``connect`` once
    # it accepted an authenticated user (only ``attached`` is read before).
    user: Any
    viewer_id: UserId
    connection_id: str
    #: the session or token the connection was opened with (presence.sessions), None when it
    #: is never re-checked (another authentication middleware)
    credential: Credential | None
    hub: Hub
    state: ConnectionState
    credentials: Credentials

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sender = Sender(self)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels (4.2+) closes old database connections before every message, in the one
        # thread all of the process's database calls share: a thread hop per heartbeat, queued
        # behind the others' queries. Done at most once per TIDY_INTERVAL per process here.
        kind = message["type"]
        if kind != "websocket.disconnect":
            # Not on a close: it would wait for that thread (a storm's queue) before signing off.
            await tidy_database_connections()
        if kind == "websocket.receive" and frames.beat_quietly(self, message.get("text")):
            return  # the most common frame by far, handled at once
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {kind}")
        await handler(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await frames.receive(self, text_data)

    # --- what the hub and the frame handlers call: done by its parts ---

    @property
    def sent(self) -> dict[UserId, domain.Presence | None]:
        return self.state.subscriptions.sent

    @property
    def snapshotting(self) -> set[UserId]:
        return self.state.subscriptions.snapshotting

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None:
        await self.sender.send(text_data, bytes_data, close)

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        await self.sender.close(code, reason)

    async def send_json(self, content: dict[str, Any]) -> None:
        await self.sender.send_json(content)

    async def send_presences(
        self,
        kind: str,
        presences: dict[UserId, domain.Presence],
        extra: dict[str, Any] | None = None,
    ) -> None:
        await self.sender.send_presences(kind, presences, extra)

    async def send_error(self, code: str, message: str, **extra: Any) -> None:
        # An error a handler sends while answering a frame of this socket names that frame,
        # as the errors the answer raises do (docs/websocket.md, Errors).
        await self.sender.send_error(code, message, **{**frames.answering(self), **extra})

    async def end_session(self) -> None:
        await self.credentials.end_session()

    async def end_account(self) -> None:
        await self.credentials.end_account()

    async def recheck_session(self) -> None:
        await self.credentials.recheck_session()

    async def over_write_limit(self) -> bool:
        """Whether the user is past HTTP_RATE_LIMIT (told so): frames installed apps add that
        write call it (presence.extensions)."""
        return await handlers.over_write_limit(self)

    def snapshot_sent(self) -> None:
        if self.opening is not None:
            # Its first snapshot is out: the next socket waiting opens (presence.admission).
            self.opening.release()
            self.opening = None

    # --- opening and closing ---

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
            if self.attached or self.recorded:
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
        query = opening_query(self.scope)
        device, device_error = device_of(self.scope, query)
        idle, idle_error = idle_of(query)
        self.state = ConnectionState(
            device=device,
            idle=idle,
            limits=lifecycle.limits(),
            rate=RateLimit(*conf.RATE_LIMIT),
            heartbeat_interval=conf.HEARTBEAT_INTERVAL,
            # The first check falls anywhere in the second half of the first interval:
            # sockets opened together (a deploy, a reconnect storm) must not all check at
            # the same moment.
            session_checked=time.time() - conf.SESSION_CHECK_INTERVAL * _draw() / 2,
        )
        # Sockets close with the session or token they were opened with (logout, password
        # change, deactivation, expiry; presence.sessions).
        self.credential = sessions.credential_of(self.scope)
        self.credentials = Credentials(self)
        # Past MAX_CONNECTIONS_PER_USER in this process alone it is refused before it waits:
        # one account's sockets must not queue ahead of everyone's (presence.admission).
        self.entry = admission.enter(self.viewer_id)
        if self.entry is None:
            await self._too_many()
            return
        # Accepted already, it waits for its turn among the openings (a reconnect storm),
        # recorded live meanwhile (see _wait_turn).
        self.opening = await self._wait_turn(device)
        if self.opening is None:
            return
        self.hub = Hub.get()
        await self.hub.attach(self)
        self.attached = True
        metrics.CONNECTIONS.inc()
        # The subscription of the opening request (docs/websocket.md): its users watched now,
        # what changed since its stamp read in the opening write's round trip, answered below.
        arrived = time.time()
        subscription = await opening_request.subscription(self, self.scope.get("query_string", b""))
        # Recent logouts are read in the opening write's round trip too; a socket closed for
        # one is signed off again at once (disconnect).
        check = None if self.credential is None else self.credentials.recent_ends_check()
        opened, ends, changed = await opening_request.write(self, device, check, subscription)
        if ends is not None and await self.credentials.ended_meanwhile(*ends):
            self._give_places_back()
            return
        if opened is not None and opened.refused:
            # The next socket in turn opens now, not once this one's close is answered.
            self._give_places_back()
            self.recorded = False  # its record before waiting expired: nothing is left
        for error in (device_error, idle_error):
            if error:
                await self.send_error("invalid_value", error)
        if await handlers.close_refused(self, opened):
            return
        self.state.written_at = time.time()
        if subscription is not None:
            await opening_request.answer(self, subscription, changed, arrived)

    async def _wait_turn(self, device: domain.Device) -> admission.Slot | None:
        """This socket's turn among the openings (None: refused meanwhile, and closed). One
        that has to wait is recorded live first: in a reconnect storm its user's previous
        connection (the process that died) expires CONNECTION_TTL after its last heartbeat,
        and the user would go offline and come back, announced to every watcher, while the
        process is busiest. Its heartbeats are written while it waits (its client's own wait
        in its queue), often enough to keep it within CONNECTION_TTL."""
        assert self.entry is not None
        waits = self.entry.must_wait()
        # In the queue now, before the write: one user's sockets keep the order they came in.
        turn = asyncio.ensure_future(self.entry.admit())
        try:
            if waits and await self._still_signed_in():
                opened = await lifecycle.aconnect(
                    self.user, self.connection_id, device.value, self.state.idle
                )
                if opened is not None and opened.refused:
                    _drop_turn(turn)
                    self._give_places_back()
                    await self._too_many()
                    return None
                # Redis unavailable: not recorded; the opening write tries again at its turn.
                self.recorded = opened is not None
            # Its record lasts CONNECTION_TTL: written again a heartbeat interval before then.
            conf = get_settings()
            every = max(conf.HEARTBEAT_INTERVAL, conf.CONNECTION_TTL - conf.HEARTBEAT_INTERVAL)
            while self.recorded and not turn.done():
                await asyncio.wait({turn}, timeout=every)
                if turn.done():
                    break
                if await self._still_signed_in():
                    await lifecycle.aheartbeat(
                        self.user, self.connection_id, device.value, self.state.idle
                    )
                else:  # its turn's opening write closes it (4401)
                    await lifecycle.adisconnect(self.user, self.connection_id)
                    self.recorded = False
            return await turn
        except BaseException:
            _drop_turn(turn)
            raise

    async def _still_signed_in(self) -> bool:
        """No logout or password change recorded lately for this socket's credential: a
        socket waiting for its turn is not in its account group yet, and must not keep a user
        who logged out online while it waits. (Redis unavailable: True; its turn checks.)"""
        if self.credential is None:
            return True
        ended, changed = await get_store().arun(self.credentials.recent_ends_check(), live=True)
        return not (ended or changed)

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
        if self.attached:
            self.attached = self.recorded = False
            metrics.CONNECTIONS.dec()
            await self._leave_hub()
        elif self.recorded:
            self.recorded = False  # closed while it waited for its turn: only signed off
        else:
            return
        await self._sign_off()

    async def _leave_hub(self) -> None:
        try:
            await self.hub.detach(self)
        except Exception:
            logger.exception("Presence: detaching a connection of user %s failed", self.viewer_id)
        try:
            await rooms.leave_all(self)
        except Exception:
            logger.exception("Presence: leaving the rooms of user %s failed", self.viewer_id)

    async def _sign_off(self) -> None:
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
