"""The WebSocket consumer at ``ws/presence/`` (protocol: docs/websocket.md).

A thin edge: frames are validated by :func:`presence.domain.parse_frame`, recorded through
:mod:`presence.lifecycle` (and :mod:`presence.api` for status changes), and fanned out by
the process's :class:`presence.hub.Hub`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import math
import random
import time
import uuid
import weakref
from collections import deque
from typing import Any
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import close_old_connections
from django.utils.translation import gettext

from presence import (
    announce,
    api,
    domain,
    extensions,
    lifecycle,
    ratelimit,
    relations,
    sessions,
    users,
)
from presence.conf import get_settings
from presence.domain import UserId
from presence.hub import Hub
from presence.memo import bounded_memo
from presence.origins import foreign_origin
from presence.store import get_store

logger = logging.getLogger("presence")

#: close codes (docs/websocket.md, "Close codes")
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FOREIGN_ORIGIN = 4403
CLOSE_RATE_LIMITED = 4429
#: also past MAX_CONNECTIONS_PER_USER (the user's other connections stay open)
CLOSE_TOO_MANY_CONNECTIONS = CLOSE_RATE_LIMITED
#: a subscribe or unsubscribe of n user ids counts as ceil(n / IDS_PER_FRAME) frames of
#: RATE_LIMIT (each id costs channel-layer and Redis work; a frame may carry a thousand)
IDS_PER_FRAME = 100
#: closes a connection whose client does not take what it is sent: the bytes the server still
#: holds for it passed MAX_UNSENT_BYTES, or the server took no frame for SEND_TIMEOUT
CLOSE_TOO_SLOW = 4408
#: presence_state and presence_diff frames longer than this go as several frames, each a partial
#: map (daphne refuses a message over 1 MiB by default; a lower limit of the server's wins)
SPLIT_FRAME_BYTES = 256 * 1024
#: each whole ANSWER_BYTES_PER_FRAME bytes of the answer to a client's frame count as one more
#: frame of RATE_LIMIT: a small frame may ask for a large answer (docs/websocket.md)
ANSWER_BYTES_PER_FRAME = 64 * 1024
#: longest wait for the server to take one frame. Servers that wait for the client to read
#: before taking more (uvicorn drains its transport) hold the send of a client that never reads;
#: daphne never waits, so its sends are not timed
SEND_TIMEOUT = 10.0

#: bytes of the answers to the client frame being handled (PresenceConsumer.receive): a context
#: variable, so that what the hub sends the connection meanwhile is not counted
_answer_bytes: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "presence_answer_bytes", default=None
)


#: how often, at most, the consumers of a process close database connections that are past
#: CONN_MAX_AGE or broken (django.db.close_old_connections), in seconds
TIDY_INTERVAL = 1.0
_tidied_at: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, float] = (
    weakref.WeakKeyDictionary()
)

#: where in its first interval a socket's first session check falls (see connect)
_draw = random.random


async def tidy_database_connections() -> None:
    """``close_old_connections`` in the database thread, once per TIDY_INTERVAL per event loop:
    a connection that broke or outlived ``CONN_MAX_AGE`` is replaced within a second."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    if now - _tidied_at.get(loop, -TIDY_INTERVAL) < TIDY_INTERVAL:
        return
    _tidied_at[loop] = now
    await sync_to_async(close_old_connections)()


class ClientGone(Exception):
    """A frame could not be sent: the client has closed the connection (or it was closed for
    reading too slowly)."""


class SendFailed(Exception):
    """The server refused a frame for another reason than a closed connection (a frame over its
    size limit, a bug): logged where it happened; the client is still there."""


#: what servers raise for a send to a closed connection: autobahn's Disconnected (daphne),
#: websockets' ConnectionClosed and uvicorn's ClientDisconnected (uvicorn), Starlette's
#: WebSocketDisconnect; matched by name, so that none of them needs to be installed
_DISCONNECTS = frozenset(
    {"Disconnected", "ConnectionClosed", "ClientDisconnected", "WebSocketDisconnect"}
)


def is_disconnect(error: BaseException) -> bool:
    """Whether a server's refusal to send means that the connection is closed."""
    return isinstance(error, ConnectionError) or any(
        cls.__name__ in _DISCONNECTS for cls in type(error).__mro__
    )


def unsent_bytes(connection: Any) -> int | None:
    """The bytes a server's connection object holds that its client has not taken yet, or None
    where it does not say. asyncio transports (uvicorn) tell; Twisted's (daphne) keep them in
    ``dataBuffer`` from ``offset`` and in ``_tempDataBuffer`` (under TLS: the TCP transport's)."""
    transport = getattr(connection, "transport", None)
    if transport is None:
        return None
    size = getattr(transport, "get_write_buffer_size", None)
    if callable(size):
        return int(size())
    for layer in (transport, getattr(transport, "transport", None)):
        data = getattr(layer, "dataBuffer", None)
        if isinstance(data, bytes):
            offset = getattr(layer, "offset", 0)
            return len(data) - int(offset) + int(getattr(layer, "_tempDataLen", 0))
    return None


def server_connection(send: Any) -> Any | None:
    """The server's connection object behind an ASGI send callable, where one can be found:
    daphne's send is ``partial(Server.handle_reply, protocol)``, behind channels' session
    wrapper (``real_send``); uvicorn's a bound method of its protocol. None elsewhere."""
    todo = [send]
    for _ in range(8):  # a few wrappers deep at most
        if not todo:
            break
        item = todo.pop()
        if isinstance(item, functools.partial):
            todo += [item.func, *item.args]
            continue
        owner = getattr(item, "__self__", item)
        if unsent_bytes(owner) is not None:
            return owner
        inner = getattr(owner, "real_send", None)
        if inner is not None:
            todo.append(inner)
    return None


def frame_limit(connection: Any) -> int:
    """The longest frame to send: SPLIT_FRAME_BYTES, or the server's own message limit where
    lower (autobahn's ``maxMessagePayloadSize`` under daphne)."""
    limit = SPLIT_FRAME_BYTES
    server_limit = getattr(connection, "maxMessagePayloadSize", 0)
    if isinstance(server_limit, int) and server_limit > 0:
        limit = min(limit, server_limit)
    return limit


class RateLimit:
    """At most ``frames`` frames in any ``seconds``-long window (a sliding log); a frame may
    weigh more than one."""

    def __init__(self, frames: int, seconds: float) -> None:
        self.frames = frames
        self.seconds = seconds
        self._log: deque[tuple[float, int]] = deque()
        self._used = 0

    def allow(self, now: float, cost: int = 1) -> bool:
        while self._log and self._log[0][0] <= now - self.seconds:
            self._used -= self._log.popleft()[1]
        # A frame heavier than the whole budget may still pass, alone in its window.
        cost = min(cost, self.frames)
        if self._used + cost > self.frames:
            return False
        self._log.append((now, cost))
        self._used += cost
        return True

    def charge(self, now: float, cost: int) -> None:
        """Count ``cost`` more frames now, as far as the budget goes (what an answer weighed):
        the frames that no longer fit are refused."""
        while self._log and self._log[0][0] <= now - self.seconds:
            self._used -= self._log.popleft()[1]
        cost = min(cost, self.frames - self._used)
        if cost > 0:
            self._log.append((now, cost))
            self._used += cost


def frame_cost(user_ids: int) -> int:
    """What a subscribe or unsubscribe of this many ids counts against RATE_LIMIT."""
    return max(1, math.ceil(user_ids / IDS_PER_FRAME))


def _foreign_origin(scope: dict[str, Any]) -> bool:
    """Whether a browser page of another site opened this socket, as the ASGI wiring's
    PresenceOriginValidator decides (presence.origins), in case a site forgot it or wired
    channels' validator. No Origin header: not a browser, so no cross-site risk."""
    return foreign_origin(scope)


def _device(scope: dict[str, Any]) -> tuple[domain.Device, str | None]:
    """The device kind from ``?device=``, else guessed from the User-Agent; and an error for
    an unknown kind (the guess is used then)."""
    headers = dict(scope.get("headers") or [])
    guess = domain.device_from_user_agent(headers.get(b"user-agent", b"").decode("latin-1") or None)
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    asked = query.get("device", [None])[0]
    if asked is None:
        return guess, None
    try:
        return domain.Device(asked), None
    except ValueError:
        return guess, gettext(
            "Unknown device %(device)s: use web, mobile or desktop; using %(guess)s."
        ) % {"device": repr(asked[:20]), "guess": guess.value}


def read_user_ids(sent: tuple[int | str, ...]) -> dict[UserId, int | str]:
    """The ids of a subscribe/unsubscribe as the site's pks, each with the value the client sent
    for it (the first, if it named a user twice), or invalid_value naming the first bad one."""
    kind = users.pk_kind()
    ids: dict[UserId, int | str] = {}
    for value in sent:
        try:
            pk = users.parse_user_id(value, kind)
        except ValueError:
            raise domain.InvalidInput(
                "invalid_value",
                gettext("%(value)s is not a user id.") % {"value": repr(value)[:60]},
            ) from None
        ids.setdefault(pk, value)
    return ids


class PresenceConsumer(AsyncWebsocketConsumer):
    # The process's hub is the one channel-layer listener; a connection needs no channel (and
    # no Redis receive) of its own. No such alias exists, so Channels gives it none.
    channel_layer_alias = "presence.hub-only"

    viewer_id: UserId
    sent: dict[UserId, domain.Presence]
    snapshotting: set[UserId]
    #: each subscribed user's id as the client sent it: the keys of the frames it receives
    spelling: dict[UserId, int | str]

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels (4.2+) closes old database connections before every message, in the one
        # thread all of the process's database calls share: a thread hop per heartbeat, queued
        # behind the others' queries. Done at most once per TIDY_INTERVAL per process here.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await tidy_database_connections()
        await handler(message)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Whatever ends the consumer (a handler's exception, a cancellation by the server,
            # a close without websocket.disconnect), it leaves the hub and Redis; shielded,
            # so that a second cancellation cannot cut the cleanup short.
            if getattr(self, "attached", False):
                await asyncio.shield(self.disconnect(1011))

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()
        # Accepted first, so that browsers see the code (a refused handshake is only 1006).
        if _foreign_origin(self.scope):
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
        self.device, device_error = _device(self.scope)
        self.idle = False
        #: when this connection's state was last written to Redis (see heartbeat)
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
        self.hub = Hub.get()
        await self.hub.attach(self)
        self.attached = True
        if self.credential is not None and await self._ended_meanwhile():
            return
        if device_error:
            await self.send_error("invalid_value", device_error)
        opened = await lifecycle.aconnect(self.user, self.connection_id, self.device.value)
        if await self._refused(opened):
            return
        self.written_at = time.time()

    async def _refused(self, transition: Any) -> bool:
        """Close a connection the store refused (MAX_CONNECTIONS_PER_USER): nothing of it was
        recorded, so nothing is closed in Redis either."""
        if transition is None or not transition.refused:
            return False
        logger.info("Presence: closing connection of user %s: too many connections", self.viewer_id)
        self.attached = False
        await self.hub.detach(self)
        await self.close(code=CLOSE_TOO_MANY_CONNECTIONS)
        return True

    async def disconnect(self, code: int) -> None:
        if not getattr(self, "attached", False):
            return
        self.attached = False
        try:
            await self.hub.detach(self)
        except Exception:
            logger.exception("Presence: detaching a connection of user %s failed", self.viewer_id)
        try:
            await lifecycle.adisconnect(self.user, self.connection_id)
        except Exception:
            logger.exception("Presence: signing off a connection of user %s failed", self.viewer_id)

    async def end_session(self) -> None:
        """Its session ended (logout, password change): closed with 4401 like an anonymous
        connection, and gone for presence at once."""
        if not getattr(self, "attached", False):
            return
        logger.info("Presence: closing connection of user %s: session ended", self.viewer_id)
        await self.close(code=CLOSE_UNAUTHENTICATED)
        await self.disconnect(CLOSE_UNAUTHENTICATED)

    async def recheck_session(self) -> None:
        credential = self.credential
        if credential is None or not getattr(self, "attached", False):
            return
        self.session_checked = time.time()
        valid = await sync_to_async(credential.is_valid)(self.viewer_id)
        if not valid:
            await self.end_session()

    async def _ended_meanwhile(self) -> bool:
        """A logout or password change announced between the handshake's read of the session
        and the hub's join of the account group reached no socket here: its mark in Redis
        does. Whether the connection was closed for it."""
        assert self.credential is not None
        store = get_store()
        ended, changed = await store.arun(
            sessions.recent_ends_plan(store, self.viewer_id, self.credential), live=True
        )
        if ended:
            await self.end_session()
        elif changed:
            await self.recheck_session()
        return not getattr(self, "attached", False)

    # --- frames -------------------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not getattr(self, "attached", False):
            return
        arrived = time.time()
        if not self.rate.allow(arrived):
            await self.rate_limited()
            return
        answered = [0]
        counting = _answer_bytes.set(answered)
        try:
            # What this frame changes is announced as made when it arrived (coalescing windows
            # count from then: see Hub.changed).
            with announce.change_started_at(arrived):
                await self._answer(text_data)
        except ClientGone:
            # Its websocket.disconnect is queued behind this frame, and will clean up.
            logger.debug("Presence: user %s left while a frame was answered", self.viewer_id)
        except SendFailed:
            pass  # logged where it failed; even the error frame telling the client was refused
        finally:
            _answer_bytes.reset(counting)
        # A small frame may ask for a large answer (a snapshot): its bytes weigh too.
        extra = answered[0] // ANSWER_BYTES_PER_FRAME
        if extra and getattr(self, "attached", False):
            self.rate.charge(time.time(), extra)

    async def _answer(self, text_data: str | None) -> None:
        try:
            await self.handle(text_data)
        except domain.InvalidInput as error:
            await self.send_error(error.code, error.message)
        except ClientGone:
            raise
        except SendFailed:
            # The server refused an answer (logged in send): the client must not wait for it.
            if getattr(self, "attached", False):
                await self.send_error(
                    "internal_error",
                    gettext("The server failed to handle this frame; try again later."),
                )
        except Exception:
            # A bug or a failure below (database, ...) must not end the connection: it is
            # logged, the client told, and the connection goes on (each handler leaves its
            # state as it found it).
            logger.exception("Presence: handling a frame of user %s failed", self.viewer_id)
            if getattr(self, "attached", False):
                await self.send_error(
                    "internal_error",
                    gettext("The server failed to handle this frame; try again later."),
                )

    async def handle(self, text_data: str | None) -> None:
        message = domain.parse_frame(text_data, self.limits, extensions.frame_parsers())
        if isinstance(message, domain.Subscribe | domain.Unsubscribe):
            # Ids cost work each: a large (un)subscribe counts as several frames.
            extra = min(frame_cost(len(message.users)), self.rate.frames) - 1
            if extra and not self.rate.allow(time.time(), extra):
                await self.rate_limited()
                return
        if isinstance(message, domain.Heartbeat):
            await self.heartbeat(message)
        elif isinstance(message, domain.Subscribe):
            await self.subscribe(read_user_ids(message.users))
        elif isinstance(message, domain.Unsubscribe):
            await self.unsubscribe(read_user_ids(message.users))
        elif isinstance(message, domain.SetStatus):
            await self.set_status(message.change)
        else:  # a frame type an installed app added (presence.extensions)
            await extensions.frame_handler(message.type)(self, message.message)

    async def rate_limited(self) -> None:
        logger.info("Presence: closing connection of user %s: rate limit", self.viewer_id)
        await self.close(code=CLOSE_RATE_LIMITED)
        await self.disconnect(CLOSE_RATE_LIMITED)

    async def heartbeat(self, message: domain.Heartbeat) -> None:
        idle = message.state is domain.HeartbeatState.IDLE
        now = time.time()
        # A session that ended where no announcement reached (deleted sessions, expiry, a
        # password set without saving the user model) ends here, on a heartbeat.
        if now - self.session_checked >= get_settings().SESSION_CHECK_INTERVAL:
            await self.recheck_session()
            if not getattr(self, "attached", False):
                return
        # A heartbeat that changes nothing, well within HEARTBEAT_INTERVAL of the last write,
        # costs Redis nothing: the connection is recorded as alive for CONNECTION_TTL anyway.
        if idle == self.idle and now - self.written_at < self.heartbeat_interval / 2:
            return
        self.idle = idle
        written = await lifecycle.aheartbeat(self.user, self.connection_id, self.device.value, idle)
        if await self._refused(written):
            return
        if written is not None:
            self.written_at = now

    async def subscribe(self, ids: dict[UserId, int | str]) -> None:
        new = [uid for uid in ids if uid not in self.sent and uid not in self.snapshotting]
        total = len(self.sent) + len(self.snapshotting) + len(new)
        if total > self.limits.max_subscriptions:
            raise domain.InvalidInput(
                "too_many_subscriptions",
                gettext(
                    "This would make %(total)d subscriptions; at most %(limit)d per connection. "
                    "Unsubscribe from some first."
                )
                % {"total": total, "limit": self.limits.max_subscriptions},
            )
        # Ids of no user first, at the cost of one query: they join no channel-layer group
        # (a frame of unknown ids would otherwise cost Redis commands for each).
        existing = await relations.aexisting(new)
        known = [uid for uid in new if uid in existing]
        # Watch before reading (relations and live state), so that a change during the read
        # is delivered after it (see Hub.deliver); its frames name each user as sent.
        self.spelling.update((uid, ids[uid]) for uid in known)
        self.snapshotting.update(known)
        try:
            await self.hub.watch(self, known)
            presences, guessed = await lifecycle.asnapshot(known, self.user)
        except BaseException:
            # Nothing of a failed subscribe stays watched.
            await asyncio.shield(self.hub.unwatch(self, known))
            self._forget_spellings(known)
            raise
        finally:
            self.snapshotting.difference_update(known)
        unknown = [uid for uid in new if uid not in presences]
        # Users deleted since the existence check were watched: leave them again.
        await self.hub.unwatch(self, [uid for uid in unknown if uid in existing])
        self._forget_spellings(unknown)
        self.sent.update(presences)
        if guessed:
            # Redis could not be read: the snapshot shows what the database alone knows
            # (offline). The hub resolves these users again, retrying until Redis answers,
            # and sends a diff where the snapshot was wrong.
            self.hub.changed(presences)
        await self.send_presences("presence_state", presences)
        if unknown:
            await self.send_error(
                "unknown_users",
                gettext("No user has the id(s) %(ids)s; the others are subscribed.")
                % {"ids": ", ".join(str(ids[uid]) for uid in unknown)},
                users=[ids[uid] for uid in unknown],
            )

    def _forget_spellings(self, user_ids: list[UserId]) -> None:
        for uid in user_ids:
            if uid not in self.sent:
                self.spelling.pop(uid, None)

    async def unsubscribe(self, ids: dict[UserId, int | str]) -> None:
        subscribed = [uid for uid in ids if uid in self.sent]
        for uid in subscribed:
            del self.sent[uid]
        self._forget_spellings(subscribed)
        await self.hub.unwatch(self, subscribed)

    async def set_status(self, change: domain.StatusChange) -> None:
        if await self.over_write_limit():
            return
        presence = await _apply_change(self.user, change)
        await self.send_json({"type": "status", "presence": presence.as_dict()})

    async def over_write_limit(self) -> bool:
        """Count one write of this user against HTTP_RATE_LIMIT, the per-user budget that HTTP
        writes share (so another socket, or a reconnect, brings no fresh one); past it the
        client is told ``rate_limited`` with ``retry_after`` and nothing is written. Frames an
        installed app adds that write call it too (presence.extensions)."""
        wait = await ratelimit.aretry_after(self.user)
        if wait is None:
            return False
        await self.send_error("rate_limited", ratelimit.limited_message(wait), retry_after=wait)
        return True

    # --- sending ------------------------------------------------------------------------------

    #: the server's connection object behind this consumer's send (server_connection), looked
    #: up on the first send; None where the server gives no way to see what it holds
    _server: Any = ...
    #: whether sends are timed (SEND_TIMEOUT): all but those to a Twisted transport (daphne),
    #: which takes every frame at once
    _timed = True
    #: the longest frame to send (frame_limit)
    _frame_limit = SPLIT_FRAME_BYTES
    #: bytes handed to the server whose send has not returned yet (a server that waits)
    _in_flight = 0
    #: this side sent websocket.close: nothing more goes out
    _closing = False

    def _server_connection(self) -> Any:
        if self._server is ...:
            connection = server_connection(self.base_send)
            self._server = connection
            self._frame_limit = frame_limit(connection)
            transport = getattr(connection, "transport", None)
            self._timed = connection is None or hasattr(transport, "get_write_buffer_size")
        return self._server

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        self._closing = True
        await super().close(code=code, reason=reason)

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None:
        if self._closing:
            raise ClientGone("the connection is closing")
        size = len(text_data) if text_data is not None else len(bytes_data or b"")
        # What the server still holds for this client (its transport's buffer, or sends not yet
        # returned where it does not say): a client that does not read must not grow it
        # without bound.
        connection = self._server_connection()
        held = self._in_flight + ((unsent_bytes(connection) or 0) if connection else 0)
        if held > get_settings().MAX_UNSENT_BYTES:
            await self.too_slow(held)
            raise ClientGone(f"{held} bytes unsent")
        answered = _answer_bytes.get()
        if answered is not None:
            answered[0] += size
        self._in_flight += size
        try:
            if self._timed:
                async with asyncio.timeout(SEND_TIMEOUT):
                    await super().send(text_data=text_data, bytes_data=bytes_data, close=close)
            else:
                await super().send(text_data=text_data, bytes_data=bytes_data, close=close)
        except TimeoutError:
            await self.too_slow(self._in_flight)
            raise ClientGone(f"no frame taken for {SEND_TIMEOUT} s") from None
        except Exception as error:
            if is_disconnect(error):
                # The client closed the socket meanwhile (daphne raises autobahn's
                # Disconnected). Not a failure of this frame's handling.
                raise ClientGone(str(error)) from error
            # Anything else (a frame over the server's size limit, a bug) leaves the client
            # waiting for what it never gets: said loudly, and answered where it can be.
            logger.error(
                "Presence: the server refused a %d-byte frame to user %s",
                size,
                getattr(self, "viewer_id", None),
                exc_info=True,
            )
            raise SendFailed(str(error)) from error
        finally:
            self._in_flight -= size

    async def too_slow(self, held: int) -> None:
        """Close a connection whose client does not take what it is sent (MAX_UNSENT_BYTES held,
        or no frame taken for SEND_TIMEOUT) with 4408, and leave the hub and Redis at once.
        Under daphne the close frame queues behind the unsent bytes: the client that reads
        gets it; one that does not is dropped when the close handshake times out (1 s)."""
        if self._closing:
            return
        logger.info(
            "Presence: closing connection of user %s: the client does not read (%d bytes held)",
            getattr(self, "viewer_id", None),
            held,
        )
        try:
            async with asyncio.timeout(SEND_TIMEOUT):
                await self.close(code=CLOSE_TOO_SLOW)
        except Exception:  # a server that waits, or one that refuses: it is closing anyway
            logger.debug("Presence: closing a slow connection failed", exc_info=True)
        await self.disconnect(CLOSE_TOO_SLOW)

    async def send_json(self, content: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(content, separators=(",", ":")))

    async def send_presences(self, kind: str, presences: dict[UserId, domain.Presence]) -> None:
        # Keys as the client sent them: an integer sent as 7 or "7" is "7", a UUID keeps its case.
        # The same text as send_json would make; each distinct presence is rendered once for
        # all the connections it goes to (a fan-out sends one presence to many).
        spelling = self.spelling
        entries = [
            f"{_json_string(str(spelling.get(uid, uid)))}:{_presence_json(p)}"
            for uid, p in presences.items()
        ]
        head = f'{{"type":{_json_string(kind)},"presences":{{'
        self._server_connection()
        room = self._frame_limit - len(head) - 2  # the frame's own bytes and closing "}}"
        # The JSON is ASCII (json.dumps escapes the rest): characters are bytes.
        body = ",".join(entries)
        if len(body) <= room:
            await self.send(text_data=f"{head}{body}}}}}")
            return
        # A map too long for one frame goes as several, each a partial map the client merges,
        # sent without a pause between them (no diff slips in between under daphne).
        chunk: list[str] = []
        size = 0
        for entry in entries:
            if chunk and size + len(entry) > room:
                await self.send(text_data=head + ",".join(chunk) + "}}")
                chunk, size = [], 0
            chunk.append(entry)
            size += len(entry) + 1
        await self.send(text_data=head + ",".join(chunk) + "}}")

    async def send_error(self, code: str, message: str, **extra: Any) -> None:
        await self.send_json({"type": "error", "code": code, "message": message, **extra})


@bounded_memo(65536)
def _json_string(value: str) -> str:
    return json.dumps(value)


@bounded_memo(4096)
def _presence_json(presence: domain.Presence) -> str:
    return json.dumps(presence.as_dict(), separators=(",", ":"))


async def _apply_change(user: Any, change: domain.StatusChange) -> domain.Presence:
    return await sync_to_async(api.apply_change)(user, change)
