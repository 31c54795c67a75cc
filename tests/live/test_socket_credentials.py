"""An open socket ends with the credentials it was opened with: a token is re-checked like a
session (password change, deactivation, expiry), a token socket is judged by its token even
beside an anonymous session cookie, and a logout or password change that lands while the
socket's process is still joining the user's account group closes it all the same."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.sessions.backends.db import SessionStore
from django.test import Client

from presence import announce, consumers
from presence.hub import Hub
from presence.routing import websocket_urlpatterns
from presence.tokens import TokenAuthMiddleware, issue_token
from tests.live.sockets import (
    BASE,
    TIMEOUT,
    Sockets,
    _asgi_headers,
    _site_socket,
    assert_closed_with,
    assert_silent,
    connections_in_redis,
    eventually,
    heartbeat,
    new_user,
    open_sockets,
    presence_settings,
    state,
    subscribe,
)
from tests.privacy_cases import quiet_login

pytestmark = [pytest.mark.uuid_site, pytest.mark.cluster, pytest.mark.pubsub_layer]

TOKEN_APP = AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    async for opened in open_sockets():
        yield opened


@pytest.fixture(autouse=True)
def _base_settings(settings: Any) -> None:
    settings.PRESENCE = dict(BASE)


async def _token_socket(
    sockets: Sockets, user: Any, cookie: bytes | None = None
) -> WebsocketCommunicator:
    token = await sync_to_async(issue_token)(user)
    headers = [*_asgi_headers(None, cookie), (b"authorization", f"Bearer {token}".encode())]
    communicator = sockets.make(..., headers=headers, app=TOKEN_APP)
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    assert await subscribe(communicator) == state({})
    return communicator


# --- tokens -----------------------------------------------------------------------------------


async def test_a_password_change_closes_open_token_sockets_with_4401(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user = await new_user(make_user)
    socket = await _token_socket(sockets, user)
    hub = Hub.current()
    assert (
        hub is not None and len(hub.registry.accounts.members[user.pk]) == 1
    )  # told of account changes

    @sync_to_async
    def change_password() -> None:
        user.set_password("a new secret")
        user.save()

    await change_password()
    await assert_closed_with(socket, 4401)
    assert user.pk not in hub.registry.accounts.members


async def test_a_deactivation_closes_open_token_sockets_with_4401(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user, other = await new_user(make_user), await new_user(make_user)
    socket = await _token_socket(sockets, user)
    others = await _token_socket(sockets, other)

    @sync_to_async
    def deactivate() -> None:
        user.is_active = False
        user.save(update_fields=["is_active"])

    await deactivate()
    await assert_closed_with(socket, 4401)
    assert await subscribe(others) == state({})  # nobody else's socket is touched


async def test_an_expired_token_closes_its_socket_at_the_check_pace(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(HEARTBEAT_INTERVAL=10, SESSION_CHECK_INTERVAL=40, TOKEN_MAX_AGE=60):
        user = await new_user(make_user)
        socket = await _token_socket(sockets, user)
        clock.shift(50)  # checked (the first check falls within the first interval): valid
        await heartbeat(socket)
        clock.shift(41)  # the token is 91 s old, past TOKEN_MAX_AGE, and a check is due
        await socket.send_json_to({"type": "heartbeat", "state": "active"})
        await assert_closed_with(socket, 4401)


async def test_a_token_socket_with_an_anonymous_session_cookie_is_judged_by_its_token(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # A native client's web view may carry a session cookie of nobody (a language choice,
    # a CSRF-protected form): the socket authenticated by its token and stays open.
    @sync_to_async
    def anonymous_session() -> bytes:
        session = SessionStore()
        session["django_language"] = "en"
        session.create()
        return f"{settings.SESSION_COOKIE_NAME}={session.session_key}".encode()

    with presence_settings(HEARTBEAT_INTERVAL=10, SESSION_CHECK_INTERVAL=40):
        user = await new_user(make_user)
        socket = await _token_socket(sockets, user, cookie=await anonymous_session())
        for _ in range(3):  # three whole intervals of checks
            clock.shift(40)
            await heartbeat(socket)
        assert await subscribe(socket) == state({})


# --- a logout or password change racing the socket's join of the account group ---------------


def _logged_in(user: Any) -> Client:
    client = Client()
    quiet_login(client, user)
    return client


async def _socket_of_a_session_logged_out(sockets: Sockets, user: Any) -> WebsocketCommunicator:
    """A socket whose handshake read a session, opened after that session's logout was
    announced (no socket of it anywhere to hear it): accepted, as the handshake found it valid."""
    client = await sync_to_async(_logged_in)(user)
    key = client.session.session_key
    session = SessionStore(key)
    await sync_to_async(session.load)()
    await announce.aannounce_session_ended(user.pk, key)
    communicator = sockets.make(user)
    communicator.scope["session"] = session
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    return communicator


async def test_a_logout_announced_before_the_account_group_is_joined_still_closes(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # The handshake read the session; the logout's announcement passed before this process
    # joined the user's account group (the worst case of the race): nothing was there to hear
    # it, but its mark in Redis is read once the group is joined.
    user = await new_user(make_user)
    communicator = await _socket_of_a_session_logged_out(sockets, user)
    await assert_closed_with(communicator, 4401)
    # Another session of the same user is not closed by it.
    other = await sync_to_async(_logged_in)(user)
    assert await subscribe(await _site_socket(sockets, other)) == state({})


async def test_a_logged_out_socket_waiting_for_its_turn_keeps_nobody_online(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any, clock: time_machine.Coordinates
) -> None:
    # A socket waiting for its turn among the openings (a reconnect storm) is recorded live
    # while it waits (presence.admission), before it is in its account group: one whose session
    # was logged out must not show its user online meanwhile. Its turn closes it.
    settings.PRESENCE = {**settings.PRESENCE, "OPENINGS_AT_ONCE": 1, "OPENING_HOLD": 30.0}
    holder, user = [await new_user(make_user) for _ in range(2)]
    first = sockets.make(holder)
    assert (await first.connect(timeout=TIMEOUT))[0]  # holds the one place
    communicator = await _socket_of_a_session_logged_out(sockets, user)
    await assert_silent(communicator, seconds=0.2)  # waiting for its turn
    assert await connections_in_redis(user) == []
    await sockets.close(first)  # its turn
    await assert_closed_with(communicator, 4401)

    async def signed_off() -> bool:
        return await connections_in_redis(user) == []

    assert await eventually(signed_off)  # (its record of the turn, signed off on the close)


async def test_a_password_change_announced_before_the_account_group_is_joined_still_closes(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user = await new_user(make_user)
    token = await sync_to_async(issue_token)(user)
    found = await sync_to_async(consumers.sessions.user_for_token)(token)
    assert found == user

    @sync_to_async
    def change_password() -> None:
        user.set_password("a new secret")
        user.save()

    await change_password()  # announced: no socket of the user anywhere yet
    communicator = sockets.make(found)  # as if the handshake had read the token just before
    communicator.scope[consumers.sessions.SCOPE_TOKEN] = token
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    await assert_closed_with(communicator, 4401)


async def test_a_logout_right_after_the_handshake_closes_the_socket_every_time(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    # The review's reproduction: the logout issued as soon as the handshake is answered, while
    # the process may still be joining the account group. 50 in a row, each closed (however
    # busy the machine: the wait ends with the close).
    from siteproject.asgi import application

    user = await new_user(make_user)
    for _ in range(50):
        client = await sync_to_async(_logged_in)(user)
        cookie = (
            f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
        )

        communicator = sockets.make(
            ..., headers=_asgi_headers(b"http://testserver", cookie.encode()), app=application
        )
        assert await communicator.connect(timeout=TIMEOUT) == (True, None)
        assert (await sync_to_async(client.post)("/logout/")).status_code == 302
        assert await communicator.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4401,
        }
        await sockets.close(communicator)
    hub = Hub.current()
    assert hub is None or user.pk not in hub.registry.accounts.members


async def test_a_socket_opened_after_a_password_change_with_new_credentials_stays_open(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # The change's mark is still in Redis: the new socket checks its token, which is valid.
    user = await new_user(make_user)

    @sync_to_async
    def change_password() -> None:
        user.set_password("a new secret")
        user.save()

    await change_password()
    socket = await _token_socket(sockets, user)
    assert await subscribe(socket) == state({})
