"""The WebSocket consumer at ws/presence/: connecting (who may), device kinds, the Origin check.

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from presence import api
from presence.hub import Hub
from tests.live.sockets import (
    ELECTRON,
    FIREFOX,
    IPHONE,
    TIMEOUT,
    Sockets,
    _asgi_headers,
    _session_cookie,
    connections_in_redis,
    error,
    new_user,
    online,
    presence,
    receive,
    state,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]


# --- connecting -------------------------------------------------------------------------------


async def test_anonymous_connection_is_closed_with_4401(sockets: Sockets) -> None:
    for user in (AnonymousUser(), ...):  # ... : no "user" in the scope at all
        communicator = sockets.make(user)
        connected, _ = await communicator.connect(timeout=TIMEOUT)
        assert connected  # accepted first, so that browsers see the code
        assert await communicator.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4401,
        }
        # Whatever it sends now is ignored.
        await communicator.send_json_to({"type": "subscribe", "users": [1]})
        assert await communicator.receive_nothing(timeout=0.1)
    assert Hub.current() is None  # an anonymous connection never reaches the hub


async def test_site_application_authenticates_by_session_and_checks_origin(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    from siteproject.asgi import application

    user = await new_user(make_user)
    cookie = await sync_to_async(_session_cookie)(user)
    origin = b"http://testserver"

    async def attempt(origin: bytes | None, cookie: bytes | None) -> WebsocketCommunicator:
        communicator = sockets.make(..., headers=_asgi_headers(origin, cookie), app=application)
        return communicator

    # No session cookie, or one of no session: anonymous, closed with 4401.
    for bad_cookie in (None, b"sessionid=not-a-session-key"):
        communicator = await attempt(origin, bad_cookie)
        assert await communicator.connect(timeout=TIMEOUT) == (True, None)
        assert await communicator.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4401,
        }

    # Another site's page (a foreign Origin, or null) is refused at the handshake even with a
    # valid session.
    for bad_origin in (b"http://evil.example", b"null"):
        communicator = await attempt(bad_origin, cookie)
        connected, _ = await communicator.connect(timeout=TIMEOUT)
        assert not connected
        await sockets.rejected(communicator)
    assert (await api.aget_presence(user, user)).as_dict() == presence(invisible=False)

    # A client sending no Origin is no browser, so no other site's page: it is served.
    communicator = await attempt(None, cookie)
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    assert await subscribe(communicator, user) == state({user.pk: online(invisible=False)})
    await sockets.close(communicator)

    # The real session: the user is online on the web from the first frame on.
    communicator = await attempt(origin, cookie)
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    assert await subscribe(communicator, user) == state({user.pk: online(invisible=False)})


# --- device kinds -----------------------------------------------------------------------------

DEVICE_CASES = [
    # (query, User-Agent, device kind recorded)
    ("?device=mobile", FIREFOX, "mobile"),
    ("?device=desktop", IPHONE, "desktop"),  # the client's word beats the guess
    ("?device=web", ELECTRON, "web"),
    ("", IPHONE, "mobile"),
    ("", ELECTRON, "desktop"),
    ("", FIREFOX, "web"),
    ("", None, "web"),
]


async def test_device_from_query_or_user_agent(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    for query, user_agent, device in DEVICE_CASES:
        user = await new_user(make_user)
        headers = [(b"user-agent", user_agent.encode())] if user_agent else []
        communicator = await sockets.open(user, query, headers)
        assert await subscribe(communicator, user) == state(
            {user.pk: online(devices=(device,), invisible=False)}
        ), (query, user_agent)


async def test_unknown_device_is_an_error_and_the_guess_is_used(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user = await new_user(make_user)
    communicator = sockets.make(user, "?device=toaster", [(b"user-agent", IPHONE.encode())])
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    assert await receive(communicator) == error(
        "invalid_value", "Unknown device 'toaster': use web, mobile or desktop; using mobile."
    )
    # The connection stays open and counts as the guessed device.
    assert await subscribe(communicator, user) == state(
        {user.pk: online(devices=("mobile",), invisible=False)}
    )


# --- origin -----------------------------------------------------------------------------------


async def test_the_consumer_refuses_foreign_origins_by_itself_with_4403(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # APP has no origin validator in front, as on a site that forgot it.
    user = await new_user(make_user)
    for origin in (b"http://evil.example", b"https://testserver.evil.example", b"null"):
        communicator = sockets.make(user, headers=[(b"origin", origin)])
        assert await communicator.connect(timeout=TIMEOUT) == (True, None)
        assert await communicator.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4403,
        }, origin
    assert await connections_in_redis(user) == []
    # A page of the site itself (ALLOWED_HOSTS), and a client sending no Origin (not a
    # browser, so no other site's page), are served.
    for headers in (
        [(b"origin", b"http://testserver")],
        [(b"origin", b"http://localhost:8000")],
        [],
    ):
        communicator = await sockets.open(user, headers=headers)
        assert await subscribe(communicator, user) == state({user.pk: online(invisible=False)})
