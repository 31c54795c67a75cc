"""The sending path of a connection, its consumer's :class:`Sender`: frames go out within the
server's limits (a client that does not read is closed with 4408; presence maps too long for one
frame go as several), and each distinct presence is rendered to JSON once for all the
connections it goes to."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import Any

from presence import domain, metrics
from presence.conf import get_settings
from presence.consumers.limits import CLOSE_TOO_SLOW, answer_bytes
from presence.consumers.state import Socket
from presence.domain import UserId
from presence.memo import bounded_memo

logger = logging.getLogger("presence")

#: presence_state and presence_diff frames longer than this go as several frames, each a partial
#: map (daphne refuses a message over 1 MiB by default; a lower limit of the server's wins)
SPLIT_FRAME_BYTES = 256 * 1024
#: longest wait for the server to take one frame. Servers that wait for the client to read
#: before taking more (uvicorn drains its transport) hold the send of a client that never reads;
#: daphne never waits, so its sends are not timed
SEND_TIMEOUT = 10.0
#: the leavings of connections closed as too slow, under way (referenced until done)
_LEAVING: set[asyncio.Future[None]] = set()


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


class Sender:
    """A connection's sending: sends that raise :class:`ClientGone` or :class:`SendFailed`
    instead of leaving a client waiting or a server holding ever more for it."""

    def __init__(self, socket: Socket) -> None:
        self.socket = socket
        #: the server's connection object behind the socket's send (server_connection),
        #: looked up on the first send; None where the server gives no way to see what it holds
        self._server: Any = ...
        #: whether sends are timed (SEND_TIMEOUT): all but those to a Twisted transport
        #: (daphne), which takes every frame at once
        self._timed = True
        #: the longest frame to send (frame_limit)
        self._frame_limit = SPLIT_FRAME_BYTES
        #: bytes handed to the server whose send has not returned yet (a server that waits)
        self._in_flight = 0
        #: this side sent websocket.close: nothing more goes out
        self.closing = False
        #: held while a presence map goes out in several frames (send_presences)
        self._map_lock: asyncio.Lock | None = None

    def _server_connection(self) -> Any:
        if self._server is ...:
            connection = server_connection(self.socket.base_send)
            self._server = connection
            self._frame_limit = frame_limit(connection)
            transport = getattr(connection, "transport", None)
            self._timed = connection is None or hasattr(transport, "get_write_buffer_size")
        return self._server

    @property
    def waits(self) -> bool:
        """Whether the server may hold a send until the client reads (timed sends)."""
        self._server_connection()
        return self._timed

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        """websocket.close, as channels sends it; nothing goes out after it."""
        self.closing = True
        message: dict[str, Any] = {"type": "websocket.close"}
        if code is not None and code is not True:
            message["code"] = code
        if reason:
            message["reason"] = reason
        await self.socket.base_send(message)

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None:
        if self.closing:
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
        answered = answer_bytes.get()
        if answered is not None:
            answered[0] += size
        self._in_flight += size
        try:
            if self._timed:
                async with asyncio.timeout(SEND_TIMEOUT):
                    await self._send(text_data, bytes_data, close)
            else:
                await self._send(text_data, bytes_data, close)
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
                getattr(self.socket, "viewer_id", None),
                exc_info=True,
            )
            raise SendFailed(str(error)) from error
        finally:
            self._in_flight -= size

    async def _send(self, text_data: str | None, bytes_data: bytes | None, close: bool) -> None:
        # websocket.send as channels' AsyncWebsocketConsumer.send makes it
        if text_data is not None:
            await self.socket.base_send({"type": "websocket.send", "text": text_data})
        elif bytes_data is not None:
            await self.socket.base_send({"type": "websocket.send", "bytes": bytes_data})
        else:
            raise ValueError("You must pass one of bytes_data or text_data")
        if close:
            await self.socket.close(close)

    async def too_slow(self, held: int) -> None:
        """Close a connection whose client does not take what it is sent (MAX_UNSENT_BYTES held,
        or no frame taken for SEND_TIMEOUT) with 4408, and leave the hub and Redis at once.
        Under daphne the close frame queues behind the unsent bytes: the client that reads
        gets it; one that does not is dropped when the close handshake times out (1 s)."""
        if self.closing:
            return
        logger.info(
            "Presence: closing connection of user %s: the client does not read (%d bytes held)",
            getattr(self.socket, "viewer_id", None),
            held,
        )
        try:
            async with asyncio.timeout(SEND_TIMEOUT):
                await self.socket.close(code=CLOSE_TOO_SLOW)
        except Exception:  # a server that waits, or one that refuses: it is closing anyway
            logger.debug("Presence: closing a slow connection failed", exc_info=True)
        # In a task of its own: the send that found the client too slow may be one of the
        # hub's tasks (a delivery, the online count's), which leaving the hub stops, and the
        # leaving (the user signed off, the watchers told) must not be cancelled with it.
        leaving = asyncio.ensure_future(self.socket.disconnect(CLOSE_TOO_SLOW))
        _LEAVING.add(leaving)
        leaving.add_done_callback(_LEAVING.discard)
        await asyncio.shield(leaving)

    async def send_json(self, content: dict[str, Any]) -> None:
        metrics.frame_sent(content.get("type", "other"))
        await self.send(text_data=json.dumps(content, separators=(",", ":")))

    async def send_presences(
        self,
        kind: str,
        presences: dict[UserId, domain.Presence],
        extra: dict[str, Any] | None = None,
    ) -> None:
        # Keys as the client sent them: an integer sent as 7 or "7" is "7", a UUID keeps its case.
        # The same text as send_json would make; each distinct presence is rendered once for
        # all the connections it goes to (a fan-out sends one presence to many). ``extra``'s
        # fields follow the map, in every frame of a map sent as several.
        metrics.frame_sent(kind)
        spelling = self.socket.state.subscriptions.spelling
        entries = [
            f"{_json_string(str(spelling.get(uid, uid)))}:{_presence_json(p)}"
            for uid, p in presences.items()
        ]
        head = f'{{"type":{_json_string(kind)},"presences":{{'
        end = "}}"
        if extra:
            end = "}," + json.dumps(extra, separators=(",", ":"))[1:]
        self._server_connection()
        room = self._frame_limit - len(head) - len(end)  # the frame's own bytes and its end
        # The JSON is ASCII (json.dumps escapes the rest): characters are bytes.
        body = ",".join(entries)
        lock = self._map_lock
        if len(body) <= room:
            if lock is None or not lock.locked():
                await self.send(text_data=f"{head}{body}{end}")
                return
            async with lock:  # after the map going out in several frames
                await self.send(text_data=f"{head}{body}{end}")
            return
        # A map too long for one frame goes as several, each a partial map the client merges.
        # A server whose send waits (uvicorn, while the client's transport is full) lets other
        # tasks run in between: the lock keeps the hub's diffs out until the last frame, or an
        # older reading in a later frame would undo a change the client was already sent.
        if lock is None:
            lock = self._map_lock = asyncio.Lock()
        async with lock:
            chunk: list[str] = []
            size = 0
            for entry in entries:
                if chunk and size + len(entry) > room:
                    await self.send(text_data=head + ",".join(chunk) + end)
                    chunk, size = [], 0
                chunk.append(entry)
                size += len(entry) + 1
            await self.send(text_data=head + ",".join(chunk) + end)

    async def send_error(self, code: str, message: str, **extra: Any) -> None:
        await self.send_json({"type": "error", "code": code, "message": message, **extra})


@bounded_memo(65536)
def _json_string(value: str) -> str:
    return json.dumps(value)


@bounded_memo(4096)
def _presence_json(presence: domain.Presence) -> str:
    return json.dumps(presence.as_dict(), separators=(",", ":"))
