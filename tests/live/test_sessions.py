"""The WebSocket consumer at ws/presence/: logout and password changes close their sockets.

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings

from presence import consumers
from presence.hub import Hub
from tests.live.sockets import (
    TIMEOUT,
    Sockets,
    _asgi_headers,
    _cookie_of,
    _logged_in_client,
    _site_socket,
    assert_closed_with,
    assert_silent,
    connections_in_redis,
    eventually,
    heartbeat,
    lets_see,
    new_user,
    online,
    presence_settings,
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


# --- sessions: logout and password changes close their sockets --------------------------------


async def test_logout_closes_that_sessions_sockets_with_4401_only(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    caplog: pytest.LogCaptureFixture,
) -> None:
    user, viewer = await new_user(make_user), await new_user(make_user)
    await lets_see(user, viewer)
    laptop, phone = [await sync_to_async(_logged_in_client)(user) for _ in range(2)]
    laptop_key = laptop.session.session_key
    tabs = [await _site_socket(sockets, laptop) for _ in range(2)]
    other_session = await _site_socket(sockets, phone)
    watcher = await sockets.open(viewer)
    assert await subscribe(tabs[0], user) == state({user.pk: online(invisible=False)})
    assert await subscribe(watcher, user) == state({user.pk: online()})

    with caplog.at_level("DEBUG"):
        response = await sync_to_async(laptop.post)("/logout/")
    assert response.status_code == 302
    for tab in tabs:
        await assert_closed_with(tab, 4401)
    assert laptop_key not in caplog.text  # never logged

    # The other session's socket is open, receives and keeps the user online.
    assert await subscribe(other_session, user) == state({user.pk: online(invisible=False)})
    await assert_silent(watcher)
    hub = Hub.current()
    assert hub is not None and len(hub.registry.accounts.members[user.pk]) == 1
    await sockets.close(other_session)
    assert user.pk not in hub.registry.accounts.members


async def test_a_password_change_closes_the_sockets_of_the_other_sessions(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    from django.contrib.auth import update_session_auth_hash
    from django.http import HttpRequest

    user = await new_user(make_user)
    changing, other = [await sync_to_async(_logged_in_client)(user) for _ in range(2)]
    other_socket = await _site_socket(sockets, other)
    changing_socket = await _site_socket(sockets, changing)

    @sync_to_async
    def change_password() -> None:
        # As django.contrib.auth's PasswordChangeView does.
        request = HttpRequest()
        request.session = changing.session
        request.user = user
        user.set_password("a new secret")
        user.save()
        update_session_auth_hash(request, user)
        request.session.save()
        changing.cookies[settings.SESSION_COOKIE_NAME] = request.session.session_key

    await change_password()
    await assert_closed_with(other_socket, 4401)
    # The changing session's socket was opened with the session's old key (Django cycles it):
    # it closes too, and the browser reconnects with its renewed session.
    await assert_closed_with(changing_socket, 4401)
    renewed = await _site_socket(sockets, changing)
    assert await subscribe(renewed, user) == state({user.pk: online(invisible=False)})
    # The other session is no session any more: anonymous.
    from siteproject.asgi import application

    cookie = await sync_to_async(_cookie_of)(other)
    refused = sockets.make(
        ..., headers=_asgi_headers(b"http://testserver", cookie), app=application
    )
    assert await refused.connect(timeout=TIMEOUT) == (True, None)
    await assert_closed_with(refused, 4401)


async def test_frames_share_one_database_tidy_per_interval(
    sockets: Sockets, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Channels would close old database connections before every frame, in the thread all
    # database calls share; the consumer does it at most once per TIDY_INTERVAL per process.
    tidied = []
    real = consumers.tidy.close_old_connections

    def counting(**kwargs: Any) -> None:
        tidied.append(1)
        real(**kwargs)

    monkeypatch.setattr(consumers.tidy, "close_old_connections", counting)
    loop = asyncio.get_running_loop()
    started = loop.time()
    communicator = await sockets.open(await new_user(make_user))
    for _ in range(10):
        await heartbeat(communicator)  # two frames each: the beat and an empty subscribe
    intervals = (loop.time() - started) // consumers.TIDY_INTERVAL + 1
    assert 1 <= len(tidied) <= intervals
    monkeypatch.setattr(consumers.tidy, "TIDY_INTERVAL", 0.0)
    before = len(tidied)
    for _ in range(5):
        await heartbeat(communicator)
    assert len(tidied) - before == 10


async def socket_of_an_ended_session(
    sockets: Sockets, make_user: Callable[..., Any]
) -> tuple[Any, WebsocketCommunicator]:
    """A user and their site socket, whose session is then deleted without a logout (an admin,
    "log out everywhere", ...): nothing announces it."""
    user = await new_user(make_user)
    client = await sync_to_async(_logged_in_client)(user)
    communicator = await _site_socket(sockets, client)
    await sync_to_async(client.session.delete)()
    return user, communicator


async def test_a_session_ended_out_of_band_closes_its_socket_at_the_session_check_pace(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(HEARTBEAT_INTERVAL=10, SESSION_CHECK_INTERVAL=40):
        user, communicator = await socket_of_an_ended_session(sockets, make_user)
        # Checked on a heartbeat, at the earliest half an interval after opening: still open.
        clock.shift(10)
        await heartbeat(communicator)
        # At the latest one interval after opening.
        clock.shift(30)
        await communicator.send_json_to({"type": "heartbeat", "state": "active"})
        await assert_closed_with(communicator, 4401)

    async def gone() -> bool:
        return await connections_in_redis(user) == []

    assert await eventually(gone)


async def test_a_clock_stepped_back_does_not_put_off_the_session_check(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(HEARTBEAT_INTERVAL=10, SESSION_CHECK_INTERVAL=40):
        _, communicator = await socket_of_an_ended_session(sockets, make_user)
        # NTP steps the clock an hour back: the check is not put off by the hour (the time
        # since the last one cannot be told, so it is taken at once).
        clock.shift(-3600)
        await communicator.send_json_to({"type": "heartbeat", "state": "active"})
        await assert_closed_with(communicator, 4401)


async def test_sockets_opened_together_check_their_sessions_at_different_moments(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A thousand sockets opened by a deploy would otherwise query the sessions all at once,
    # every interval, in the one database thread the live updates wait for.
    draws = iter([0.0, 0.9])
    monkeypatch.setattr(consumers.consumer, "_draw", lambda: next(draws))
    with presence_settings(HEARTBEAT_INTERVAL=10, SESSION_CHECK_INTERVAL=40):
        first, second = await new_user(make_user), await new_user(make_user)
        clients = [await sync_to_async(_logged_in_client)(user) for user in (first, second)]
        late = await _site_socket(sockets, clients[0])  # checks a whole interval on
        early = await _site_socket(sockets, clients[1])  # checks 0.55 of an interval on
        for client in clients:
            await sync_to_async(client.session.delete)()
        clock.shift(25)
        await heartbeat(late)
        await early.send_json_to({"type": "heartbeat", "state": "active"})
        await assert_closed_with(early, 4401)
        clock.shift(15)
        await late.send_json_to({"type": "heartbeat", "state": "active"})
        await assert_closed_with(late, 4401)
