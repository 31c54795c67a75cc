"""The WebSocket consumer at ws/presence/, end to end: WebsocketCommunicator against the real
channels_redis layer and a real Redis (no mocks, no in-memory layer).

Time that matters to presence (time.time) is controlled with the ``clock`` fixture or
time_machine; the event loop's clock is real and only paces the coalescing window, so waiting
for a frame (``receive_json_from(timeout=...)``) and asserting silence for a short while
(``receive_nothing``) are the only real waits.

The helpers the consumer's tests share (tests/live/test_connecting.py and its neighbours, and
other test modules): frames, the ``sockets`` fixture, the settings every test starts from.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client, override_settings

from presence import announce, signals
from presence.hub import Hub
from presence.models import Contact, LastSeen, PrivacySettings, UserStatus
from presence.routing import websocket_urlpatterns
from presence.store import get_store
from tests.clock import at
from tests.conftest import close_pubsub_layer
from tests.ids import missing_id, wire_id
from tests.privacy_cases import quiet_login

APP = URLRouter(websocket_urlpatterns)
UNKNOWN_ID = wire_id(missing_id())
#: the settings every test here starts from: a short coalescing window keeps tests quick, the
#: hub's own sweep stays out of the way (tests call lifecycle.asweep() after moving the clock),
#: and a busy test machine is not taken for a Redis outage
BASE = {"COALESCE_WINDOW": 0.05, "SWEEP_INTERVAL": 3600, "SOCKET_TIMEOUT": 5}
#: long enough for a diff to arrive if one was going to (window 0.05 s + a few queries)
QUIET = 0.2
#: how long a frame (or a handshake, or a close) that must come may take: it bounds waits that
#: end as soon as it comes, so it is generous, for a test machine saturated by other work
TIMEOUT = 10
IPHONE = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148"
ELECTRON = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/124.0 Electron/30.0.1"
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0"

# --- frames and presences ---------------------------------------------------------------------


def presence(
    status: str = "offline",
    last_seen: str | None = None,
    devices: tuple[str, ...] | list[str] = (),
    text: str | None = None,
    emoji: str | None = None,
    activity: str | None = None,
    last_seen_approx: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A PRESENCE object as the protocol sends it (``invisible`` only in one's own)."""
    return {
        "status": status,
        "last_seen": last_seen,
        "last_seen_approx": last_seen_approx,
        "devices": list(devices),
        "text": text,
        "emoji": emoji,
        "activity": activity,
        **extra,
    }


HIDDEN = presence()
#: hidden but not blocked, last seen today: the approximate last seen is all that shows
HIDDEN_RECENTLY = presence(last_seen_approx="recently")


def iso(seconds: float = 0) -> str:
    """The ISO 8601 time ``seconds`` after the clock fixture's start."""
    return at(seconds).isoformat()


def online(seconds: float = 0, devices: tuple[str, ...] = ("web",), **fields: Any) -> dict:
    return presence("online", iso(seconds), devices, **fields)


def state(presences: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    return {"type": "presence_state", "presences": {str(k): v for k, v in presences.items()}}


def diff(presences: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    return {"type": "presence_diff", "presences": {str(k): v for k, v in presences.items()}}


def error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, **extra}


def status_reply(own: dict[str, Any]) -> dict[str, Any]:
    return {"type": "status", "presence": own}


def presence_settings(**overrides: Any) -> override_settings:
    return override_settings(PRESENCE={**BASE, **overrides})


# --- connections ------------------------------------------------------------------------------


class Sockets:
    """Opens communicators and closes every one of them at the end of the test."""

    def __init__(self) -> None:
        self.opened: list[WebsocketCommunicator] = []

    def make(
        self,
        user: Any,
        query: str = "",
        headers: list[tuple[bytes, bytes]] | None = None,
        app: Any = APP,
    ) -> WebsocketCommunicator:
        communicator = WebsocketCommunicator(app, "/ws/presence/" + query, headers=headers)
        if user is not ...:
            communicator.scope["user"] = user
        self.opened.append(communicator)
        return communicator

    async def open(
        self,
        user: Any,
        query: str = "",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> WebsocketCommunicator:
        """An accepted connection whose opening heartbeat has been recorded."""
        communicator = self.make(user, query, headers)
        connected, _ = await communicator.connect(timeout=TIMEOUT)
        assert connected
        # The accept goes out before the opening heartbeat is written; frames are handled in
        # order after the connect handler, so an answered (empty) subscribe means it was.
        assert await subscribe(communicator) == state({})
        return communicator

    async def close(self, communicator: WebsocketCommunicator) -> None:
        self.opened.remove(communicator)
        await communicator.disconnect(timeout=TIMEOUT)

    async def rejected(self, communicator: WebsocketCommunicator) -> None:
        """A refused handshake has no connection to close: end the application task."""
        self.opened.remove(communicator)
        await communicator.wait(timeout=0.1)

    async def close_all(self) -> bool:
        """Close what is open; True if every consumer was still running (a clean test)."""
        clean = True
        for communicator in self.opened:
            if communicator.future.done():
                clean = clean and not communicator.future.cancelled()
                continue
            await communicator.disconnect(timeout=TIMEOUT)
        self.opened.clear()
        return clean


async def open_sockets() -> AsyncIterator[Sockets]:
    """The body of the ``sockets`` fixture (other test modules define theirs with it)."""
    opened = Sockets()
    yield opened
    clean = await opened.close_all()
    hub = Hub.current()
    if hub is not None:
        if clean:
            # Every connection left the hub, which stopped its tasks and left its groups.
            assert hub.registry.connections == set()
            assert hub.registry.watchers.members == {}
            assert hub.registry.watchers.of == {}  # nor any connection's list of them
            assert hub.tasks.running == []
        elif hub.tasks.running:
            await hub._stop()  # a consumer was cancelled by a failing assertion
        # The sweeps a stopped hub goes on with (for CONNECTION_TTL + OFFLINE_GRACE) end here.
        if hub.tasks.lingering is not None:
            hub.tasks.lingering.cancel()
    await close_pubsub_layer()
    # Nothing of the hub may outlive it (a channel-layer receive may take up to its BZPOPMIN
    # timeout, 5 s, to end after a cancellation it swallowed; more on a busy machine).
    lingering = asyncio.all_tasks() - {asyncio.current_task()}
    if lingering:
        _, lingering = await asyncio.wait(lingering, timeout=15)
    assert lingering == set()
    await get_store().aclose()


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    # After the database fixtures: closing connections writes LastSeen before the flush.
    async for opened in open_sockets():
        yield opened


@pytest.fixture(autouse=True)
def _base_settings(settings: Any) -> None:
    settings.PRESENCE = dict(BASE)


async def new_user(make_user: Callable[..., Any], **fields: Any) -> Any:
    return await sync_to_async(make_user)(**fields)


@sync_to_async
def lets_see(target: Any, *viewers: Any, close_friend: bool = False) -> None:
    """``target`` adds the viewers to its contacts (contacts visibility lets them see it)."""
    for viewer in viewers:
        Contact.objects.create(owner=target, contact=viewer, close_friend=close_friend)


async def subscribe(communicator: WebsocketCommunicator, *users: Any) -> dict[str, Any]:
    ids = [u if isinstance(u, int | str) else wire_id(u) for u in users]
    await communicator.send_json_to({"type": "subscribe", "users": ids})
    return await communicator.receive_json_from(timeout=TIMEOUT)


async def send_frame(communicator: WebsocketCommunicator, text: str) -> None:
    # send_to() refuses an empty string; the ASGI event carries any text.
    await communicator.send_input({"type": "websocket.receive", "text": text})


async def receive(communicator: WebsocketCommunicator) -> dict[str, Any]:
    return await communicator.receive_json_from(timeout=TIMEOUT)


async def assert_silent(*communicators: WebsocketCommunicator, seconds: float = QUIET) -> None:
    for communicator in communicators:
        assert await communicator.receive_nothing(timeout=seconds), await receive(communicator)
        seconds = 0.01  # the others had the same time already


class Stall:
    """A client that stops reading, behind a server whose send waits for it (uvicorn, the
    client's transport full): once ``armed``, its server hands it the first frame of ``kind``
    and then holds that send (``held``) until ``drained`` (it reads again)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.armed, self.held, self.drained = asyncio.Event(), asyncio.Event(), asyncio.Event()

    def app(self) -> Any:
        """The test app behind such a server (``Sockets.make(user, app=stall.app())``)."""

        async def app(scope: Any, receive_: Any, send: Any) -> None:
            async def server_send(message: dict[str, Any]) -> None:
                await send(message)
                text = message.get("text", "")
                if self.armed.is_set() and not self.held.is_set() and f'"{self.kind}"' in text:
                    self.held.set()
                    await self.drained.wait()

            await APP(scope, receive_, server_send)

        return app


async def eventually(check: Callable[[], Any], timeout: float = TIMEOUT) -> bool:
    """Whether ``check()`` (maybe a coroutine) holds within ``timeout``: for work a consumer
    does after its last frame out, which no later frame can confirm."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return True
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)


async def set_status(communicator: WebsocketCommunicator, **fields: Any) -> dict[str, Any]:
    await communicator.send_json_to({"type": "set_status", **fields})
    return await receive(communicator)


async def set_own_status(
    communicator: WebsocketCommunicator, **fields: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """set_status on a socket subscribed to its own user: (the reply, the diff of the change),
    in whichever order they came. The reply goes out when the handler is done, the diff when
    the hub's coalescing window ends: on a busy machine the handler's last reads can take
    longer than the window, and nothing (docs/websocket.md) orders the two."""
    await communicator.send_json_to({"type": "set_status", **fields})
    first, second = await receive(communicator), await receive(communicator)
    return (second, first) if first["type"] == "presence_diff" else (first, second)


def announced_about(hub: Hub, user: Any, sent: float) -> None:
    """As if an announcement that ``user`` changed, sent at ``sent``, reached ``hub`` now."""
    hub.dispatch({"type": announce.CHANGED, "users": [wire_id(user)], "at": sent, "sent": sent})


async def heartbeat(communicator: WebsocketCommunicator, state_: str = "active") -> None:
    await communicator.send_json_to({"type": "heartbeat", "state": state_})
    # Frames are handled in order: an answered (empty) subscribe means the beat was recorded.
    assert await subscribe(communicator) == state({})


@sync_to_async
def last_seen_row(user: Any) -> datetime | None:
    row = LastSeen.objects.filter(user=user).first()
    return row.seen_at if row else None


# --- for test_connecting.py (connecting) ------------------------------------------------------


def _session_cookie(user: Any) -> bytes:
    """A real session in the session store (logged in without recording activity)."""
    client = Client()
    quiet_login(client, user)
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}".encode()


def _asgi_headers(origin: bytes | None, cookie: bytes | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"host", b"testserver"), (b"user-agent", FIREFOX.encode())]
    if origin is not None:
        headers.append((b"origin", origin))
    if cookie is not None:
        headers.append((b"cookie", cookie))
    return headers


# --- for test_going_offline.py (going offline: reload grace, last seen, crashed connections) ---


async def connections_in_redis(user: Any) -> list[str]:
    """The user's live connections as the store keeps them ("id:bit:idle:since:beat")."""
    store = get_store()
    return await store.arun(store.plans.describe_connections(user.pk))


# --- for test_bad_input.py (bad input) --------------------------------------------------------


@sync_to_async
def database_state(*users: Any) -> dict[str, Any]:
    ids = [u.pk for u in users]
    return {
        model.__name__: sorted(
            tuple(sorted(row.items())) for row in model.objects.filter(user__in=ids).values()
        )
        for model in (UserStatus, PrivacySettings, LastSeen)
    }


def redis_state(client: redis.Redis) -> dict[str, Any]:
    """Every presence key and its content (the channel layer's keys are left out).

    A transition's signal-outbox claim (a ZREM) runs on the receivers' thread after the write
    that made it, late on a busy machine: earlier work is let finish first, so that it is not
    taken for a change made by what comes next."""
    signals.wait_sent()
    dump: dict[str, Any] = {}
    for key in sorted(client.scan_iter("presence:*")):
        kind = client.type(key)
        if kind == "zset":
            dump[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            dump[key] = client.hgetall(key)
        else:
            dump[key] = (kind, client.dump(key))
    return dump


def subscriptions() -> dict[int, int]:
    """User id -> number of this process's connections subscribed to it."""
    hub = Hub.current()
    assert hub is not None
    return {uid: len(watchers) for uid, watchers in hub.registry.watchers.members.items()}


# --- for test_sessions.py (sessions: logout and password changes close their sockets) ---------


def _logged_in_client(user: Any) -> Client:
    client = Client()
    quiet_login(client, user)
    return client


def _cookie_of(client: Client) -> bytes:
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}".encode()


async def _site_socket(sockets: Sockets, client: Client) -> WebsocketCommunicator:
    """A socket through the demo's ASGI application, authenticated by the client's session."""
    from siteproject.asgi import application

    cookie = await sync_to_async(_cookie_of)(client)
    communicator = sockets.make(
        ..., headers=_asgi_headers(b"http://testserver", cookie), app=application
    )
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    assert await subscribe(communicator) == state({})
    return communicator


async def assert_closed_with(communicator: WebsocketCommunicator, code: int) -> None:
    assert await communicator.receive_output(timeout=TIMEOUT) == {
        "type": "websocket.close",
        "code": code,
    }


# --- for test_connections_per_user.py (connections per user (MAX_CONNECTIONS_PER_USER)) -------


async def refused(communicator: WebsocketCommunicator) -> bool:
    """Whether the connection was accepted and then closed with 4429 before any frame."""
    connected, _ = await communicator.connect(timeout=TIMEOUT)
    assert connected  # accepted first, so that browsers see the close code
    return await communicator.receive_output(timeout=TIMEOUT) == {
        "type": "websocket.close",
        "code": 4429,
    }
