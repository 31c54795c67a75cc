"""presence.routing.PresenceOriginValidator: the WebSocket's ASGI wiring refuses other sites'
pages at the handshake, as channels' AllowedHostsOriginValidator does, and serves native clients,
which send no Origin."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from presence.routing import PresenceOriginValidator, websocket_urlpatterns
from presence.tokens import TokenAuthMiddleware, issue_token

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections", "clock"),
]

TIMEOUT = 10  # bounds waits for what must come; generous for a busy machine
#: the documented wiring, with tokens for native clients
APP = PresenceOriginValidator(
    AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))
)


class Sockets:
    """Communicators of one test, each ended at its end (accepted or refused)."""

    def __init__(self) -> None:
        self.made: list[WebsocketCommunicator] = []

    def make(self, token: str, origin: bytes | None, app: Any = APP) -> WebsocketCommunicator:
        headers = [(b"host", b"testserver"), (b"authorization", f"Bearer {token}".encode())]
        if origin is not None:
            headers.append((b"origin", origin))
        communicator = WebsocketCommunicator(app, "/ws/presence/?device=mobile", headers=headers)
        self.made.append(communicator)
        return communicator


@pytest.fixture
async def sockets() -> AsyncIterator[Sockets]:
    made = Sockets()
    yield made
    for communicator in made.made:
        if not communicator.future.done():
            await communicator.disconnect(timeout=TIMEOUT)


@pytest.fixture
async def token(make_user: Callable[..., Any]) -> str:
    ann = await sync_to_async(make_user)("ann")
    token: str = await sync_to_async(issue_token)(ann)
    return token


async def assert_served(communicator: WebsocketCommunicator) -> None:
    connected, _ = await communicator.connect(timeout=TIMEOUT)
    assert connected
    await communicator.send_json_to({"type": "subscribe", "users": []})
    assert await communicator.receive_json_from(timeout=TIMEOUT) == {
        "type": "presence_state",
        "presences": {},
    }


async def assert_refused_at_the_handshake(communicator: WebsocketCommunicator) -> None:
    connected, _ = await communicator.connect(timeout=TIMEOUT)
    assert not connected  # a 403 to the upgrade request: never accepted
    await communicator.wait(timeout=0.1)  # the denier waits for a disconnect that never comes


async def test_a_client_without_origin_is_served(sockets: Sockets, token: str) -> None:
    # A native or mobile app: not a browser, so not another site's page.
    await assert_served(sockets.make(token, origin=None))


@pytest.mark.parametrize(
    "origin", [b"http://testserver", b"https://testserver", b"http://localhost:8000"]
)
async def test_a_page_of_an_allowed_host_is_served(
    sockets: Sockets, token: str, origin: bytes
) -> None:
    await assert_served(sockets.make(token, origin))


@pytest.mark.parametrize(
    "origin",
    [
        b"http://evil.example",
        b"https://testserver.evil.example",
        # sandboxed iframes, file:// pages, some redirects: a browser, of no site of ours
        b"null",
        b"",
        b"http://[::1",  # not even a URL
    ],
)
async def test_a_foreign_or_opaque_origin_is_refused_at_the_handshake(
    sockets: Sockets, token: str, origin: bytes
) -> None:
    await assert_refused_at_the_handshake(sockets.make(token, origin))


async def test_a_refusal_leaves_nothing_waiting(sockets: Sockets, token: str) -> None:
    # The application ends with the refusal: channels' denier, a consumer, kept listening on
    # the channel layer for a disconnect the refused client never sends (with a Redis layer,
    # a receive that later logged a timeout as an error, for any page's attempt).
    communicator = sockets.make(token, b"http://evil.example")
    connected, _ = await communicator.connect(timeout=TIMEOUT)
    assert not connected
    await asyncio.wait_for(asyncio.shield(communicator.future), TIMEOUT)
    assert communicator.future.exception() is None


@override_settings(DEBUG=True, ALLOWED_HOSTS=[])
async def test_in_debug_without_allowed_hosts_localhost_is_allowed(
    sockets: Sockets, token: str
) -> None:
    # As Django's host check and channels' validator do in development.
    await assert_served(sockets.make(token, b"http://localhost:8000"))
    await assert_served(sockets.make(token, b"http://127.0.0.1:8000"))
    await assert_served(sockets.make(token, origin=None))
    await assert_refused_at_the_handshake(sockets.make(token, b"http://evil.example"))


async def test_allowed_hosts_are_read_when_a_client_connects(sockets: Sockets, token: str) -> None:
    # The application is built at import; settings changed later (tests, a reloaded setting)
    # still apply.
    with override_settings(ALLOWED_HOSTS=["chat.example.com"]):
        await assert_served(sockets.make(token, b"https://chat.example.com"))
        await assert_refused_at_the_handshake(sockets.make(token, b"http://testserver"))


async def test_channels_validator_still_refuses_a_client_without_origin(
    sockets: Sockets, token: str
) -> None:
    # Why presence ships its own: the contract's wiring stays valid for browsers, but turns
    # native clients away (docs/websocket.md).
    app = AllowedHostsOriginValidator(
        AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))
    )
    await assert_refused_at_the_handshake(sockets.make(token, origin=None, app=app))
    await assert_served(sockets.make(token, b"http://testserver", app=app))


async def test_it_guards_websockets_only() -> None:
    with pytest.raises(ValueError, match="WebSocket"):
        await APP({"type": "http"}, None, None)
