"""presence.tokens: signed tokens for native and mobile clients, on the WebSocket (an ASGI
middleware setting scope["user"]) and on the JSON endpoints (a Django middleware)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, override_settings
from django.urls import path

from presence import api
from presence.conf import get_settings
from presence.models import UserStatus
from presence.routing import websocket_urlpatterns
from presence.tokens import TokenAuthMiddleware, bearer_token, issue_token, user_for_token

APP = AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))
WITH_TOKENS = [*settings.MIDDLEWARE, "presence.tokens.TokenAuthenticationMiddleware"]
#: bounds socket waits for what must come (channels' default is 1 s): generous for a busy machine
TIMEOUT = 10


# --- the token ---------------------------------------------------------------------------


def test_a_token_names_its_user(make_user: Callable[..., Any]) -> None:
    ann = make_user("ann")
    assert user_for_token(issue_token(ann)) == ann


def test_a_bad_expired_or_outdated_token_names_nobody(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    ann = make_user("ann")
    token = issue_token(ann)
    assert user_for_token(token[:-2] + "xx") is None
    assert user_for_token("not a token") is None
    clock.shift(timedelta(seconds=get_settings().TOKEN_MAX_AGE + 1))
    assert user_for_token(token) is None
    fresh = issue_token(ann)
    ann.set_password("changed")
    ann.save()
    assert user_for_token(fresh) is None  # a new password ends every token
    ann.is_active = False
    ann.save()
    assert user_for_token(issue_token(ann)) is None


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Token abc", None),
        ("Bearer", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


# --- the WebSocket -------------------------------------------------------------------------


def _socket(token: str, device: str = "mobile") -> WebsocketCommunicator:
    return WebsocketCommunicator(
        APP,
        f"/ws/presence/?device={device}",
        headers=[(b"authorization", f"Bearer {token}".encode())],
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_a_mobile_client_connects_with_a_token(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    ann = await sync_to_async(make_user)("ann")
    token = await sync_to_async(issue_token)(ann)
    socket = _socket(token)
    connected, _ = await socket.connect(timeout=TIMEOUT)
    assert connected
    try:
        await socket.send_json_to({"type": "subscribe", "users": [ann.pk]})
        reply = await socket.receive_json_from(timeout=TIMEOUT)
        assert reply["type"] == "presence_state"
        own = reply["presences"][str(ann.pk)]
        assert own["status"] == "online" and own["devices"] == ["mobile"]
        assert (await api.aget_presence(ann, ann)).devices == ("mobile",)
    finally:
        await socket.disconnect(timeout=TIMEOUT)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_a_bad_token_is_closed_with_4401_and_never_logged(
    make_user: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    ann = await sync_to_async(make_user)("ann")
    bad = (await sync_to_async(issue_token)(ann))[:-3] + "abc"
    with caplog.at_level("DEBUG"):
        socket = _socket(bad)
        connected, _ = await socket.connect(timeout=TIMEOUT)
        assert connected  # accepted, then closed, so that the client sees the code
        assert await socket.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4401,
        }
        await socket.wait()
    assert bad not in caplog.text
    assert (await api.aget_presence(ann, ann)).status == "offline"


# --- the JSON endpoints --------------------------------------------------------------------


@override_settings(MIDDLEWARE=WITH_TOKENS)
def test_the_json_endpoints_take_a_token(make_user: Callable[..., Any]) -> None:
    ann = make_user("ann")
    token = issue_token(ann)
    client = Client(enforce_csrf_checks=True)  # an app has no CSRF cookie or token
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    read = client.get(f"/presence/api/presence?users={ann.pk}", **auth)
    assert read.status_code == 200
    assert read.json()["presences"][str(ann.pk)]["invisible"] is False  # ann's own view
    posted = client.post(
        "/presence/api/status",
        json.dumps({"status": "dnd"}),
        content_type="application/json",
        **auth,
    )
    assert posted.status_code == 200
    assert UserStatus.objects.get(user=ann).dnd is True
    bad = client.get(f"/presence/api/presence?users={ann.pk}", HTTP_AUTHORIZATION="Bearer x")
    assert bad.status_code == 401


@override_settings(MIDDLEWARE=WITH_TOKENS)
def test_a_session_login_is_served_beside_the_token_middleware(
    make_user: Callable[..., Any],
) -> None:
    ann = make_user("ann")
    client = Client()
    client.force_login(ann)
    read = client.get(f"/presence/api/presence?users={ann.pk}")
    assert read.status_code == 200 and read.json()["presences"][str(ann.pk)]["invisible"] is False
    assert Client().get(f"/presence/api/presence?users={ann.pk}").status_code == 401


@override_settings(MIDDLEWARE=WITH_TOKENS)
def test_a_session_request_still_needs_its_csrf_token(make_user: Callable[..., Any]) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("ann"))
    posted = client.post(
        "/presence/api/status", json.dumps({"status": "dnd"}), content_type="application/json"
    )
    assert posted.status_code == 403 and posted.json()["error"]["code"] == "csrf_failed"


@override_settings(MIDDLEWARE=WITH_TOKENS)
def test_the_feed_endpoints_take_a_token_too(make_user: Callable[..., Any]) -> None:
    ann = make_user("ann")
    client = Client(enforce_csrf_checks=True)
    posted = client.post(
        "/presence/api/feed/post",
        json.dumps({"text": "Hello from the app"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {issue_token(ann)}",
    )
    assert posted.status_code == 201
    assert posted.json()["activity"]["author"]["id"] == ann.pk


# --- the JSON endpoints under ASGI (the middleware's async path) ---------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
@override_settings(MIDDLEWARE=WITH_TOKENS)
async def test_under_asgi_a_session_login_is_served(make_user: Callable[..., Any]) -> None:
    # The session's user is loaded lazily from the database: the async path must await it.
    ann = await sync_to_async(make_user)("ann")
    client = AsyncClient()
    await client.aforce_login(ann)
    read = await client.get(f"/presence/api/presence?users={ann.pk}")
    assert read.status_code == 200, read.content
    assert read.json()["presences"][str(ann.pk)]["invisible"] is False  # ann's own view
    posted = await client.post(
        "/presence/api/status", json.dumps({"status": "dnd"}), content_type="application/json"
    )
    assert posted.status_code == 200, posted.content
    assert (await UserStatus.objects.aget(user=ann)).dnd is True


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
@override_settings(MIDDLEWARE=WITH_TOKENS)
async def test_under_asgi_a_token_is_served_and_a_bad_one_is_401(
    make_user: Callable[..., Any],
) -> None:
    ann = await sync_to_async(make_user)("ann")
    token = await sync_to_async(issue_token)(ann)
    client = AsyncClient(enforce_csrf_checks=True)
    auth = {"authorization": f"Bearer {token}"}
    read = await client.get(f"/presence/api/presence?users={ann.pk}", headers=auth)
    assert read.status_code == 200, read.content
    assert read.json()["presences"][str(ann.pk)]["invisible"] is False
    posted = await client.post(
        "/presence/api/status",
        json.dumps({"status": "dnd"}),
        content_type="application/json",
        headers=auth,
    )
    assert posted.status_code == 200, posted.content
    assert (await UserStatus.objects.aget(user=ann)).dnd is True
    bad = await client.get(
        f"/presence/api/presence?users={ann.pk}", headers={"authorization": "Bearer x"}
    )
    assert bad.status_code == 401


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
@override_settings(MIDDLEWARE=WITH_TOKENS)
async def test_under_asgi_an_anonymous_request_is_401(make_user: Callable[..., Any]) -> None:
    ann = await sync_to_async(make_user)("ann")
    read = await AsyncClient().get(f"/presence/api/presence?users={ann.pk}")
    assert read.status_code == 401
    assert read.json()["error"]["code"] == "not_authenticated"


async def _whoami(request: HttpRequest) -> HttpResponse:
    user = await request.auser()  # type: ignore[attr-defined]
    return HttpResponse(user.get_username() if user.is_authenticated else "anonymous")


urlpatterns = [path("whoami/", _whoami)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
@override_settings(MIDDLEWARE=WITH_TOKENS, ROOT_URLCONF=__name__)
async def test_under_asgi_an_async_view_awaiting_auser_sees_the_tokens_user(
    make_user: Callable[..., Any],
) -> None:
    ann = await sync_to_async(make_user)("ann")
    token = await sync_to_async(issue_token)(ann)
    client = AsyncClient()
    assert (await client.get("/whoami/")).content == b"anonymous"
    answer = await client.get("/whoami/", headers={"authorization": f"Bearer {token}"})
    assert answer.content == b"ann"
