"""Browsing pages without presence.js after the last socket closed (the admin, say): the user
is online to friends at once and stays so past OFFLINE_GRACE, whatever TOUCH_INTERVAL.

Real sockets (WebsocketCommunicator), pages through the middleware (Django's test Client).
Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path

from presence import api, lifecycle
from presence.conf import get_settings
from presence.domain import Status
from presence.middleware import listener
from tests.clock import at
from tests.live.sockets import (
    Sockets,
    assert_silent,
    lets_see,
    new_user,
    online,
    state,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets


def admin_page(request: HttpRequest) -> HttpResponse:
    return HttpResponse("no presence.js here")


urlpatterns = [path("admin-page/", admin_page)]

pytestmark = [
    pytest.mark.urls(__name__),
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]


@sync_to_async
def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)  # records the login: pages are throttled for TOUCH_INTERVAL
    listener.ensure()
    return client


@sync_to_async
def page(client: Client) -> None:
    assert client.get("/admin-page/").status_code == 200


async def seen_by(target: Any, viewer: Any) -> tuple[Status, Any]:
    seen = await api.aget_presence(target, viewer)
    return seen.status, seen.last_seen


async def test_pages_after_the_last_close_keep_the_user_online(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    grace = get_settings().OFFLINE_GRACE
    assert get_settings().TOUCH_INTERVAL > 10
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    browser = await logged_in(target)
    tab = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})

    clock.shift(5)
    await page(browser)  # a link to the admin: asked for while the tab's socket is open ...
    clock.shift(1)
    await sockets.close(tab)  # ... which closes as the admin page replaces it (T0+6)
    clock.shift(1)
    await page(browser)  # T0+7: another admin page, after the close
    # At once: online, seen just now (the listener may take a moment to hear the close).
    for _ in range(500):
        if await seen_by(target, viewer) == (Status.ONLINE, at(7)):
            break
        await asyncio.sleep(0.01)
    assert await seen_by(target, viewer) == (Status.ONLINE, at(7))

    # Past the close's grace: no offline diff, no offline transition, still online.
    clock.shift(grace + 1)
    assert (await lifecycle.asweep()).offline == []
    await assert_silent(watcher)
    assert await seen_by(target, viewer) == (Status.ONLINE, at(7))
