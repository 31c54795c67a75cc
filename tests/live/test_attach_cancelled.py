"""A socket whose handler the server cancels while it joins the hub (daphne's
application_close_timeout, uvicorn's shutdown): nothing of it stays in the hub, which stops once
the last other socket closes. Real channels_redis layer, real Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from django.contrib.sessions.backends.db import SessionStore
from django.test import Client

from presence.announce import account_group_name
from presence.hub import Hub
from presence.hub.groups import Groups
from tests.live.sockets import TIMEOUT, Sockets, eventually, new_user

# The fixtures: the settings every test starts from (autouse), the sockets.
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets
from tests.privacy_cases import quiet_login

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
]


def _session_of(user: Any) -> SessionStore:
    client = Client()
    quiet_login(client, user)
    session = SessionStore(client.session.session_key)
    session.load()
    return session


async def test_a_socket_cancelled_while_it_joins_its_account_group_leaves_the_hub(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user, other = await new_user(make_user), await new_user(make_user)
    keep = await sockets.open(other)  # the hub runs for another socket meanwhile
    hub = Hub.current()
    assert hub is not None
    join, joining, joined = Groups.join, asyncio.Event(), asyncio.Event()

    async def slow_join(self: Groups, group: str) -> None:
        if group == account_group_name(user.pk):
            joining.set()
            await joined.wait()
        await join(self, group)

    monkeypatch.setattr(Groups, "join", slow_join)
    socket = sockets.make(user)
    socket.scope["session"] = await sync_to_async(_session_of)(user)
    assert (await socket.connect(timeout=TIMEOUT))[0]
    await asyncio.wait_for(joining.wait(), TIMEOUT)  # Hub.attach joins the account group
    socket.future.cancel()  # the server gives up on the handler
    with contextlib.suppress(asyncio.CancelledError):
        await socket.future
    sockets.opened.remove(socket)
    joined.set()

    def left() -> bool:
        return all(c.viewer_id != user.pk for c in hub.registry.connections) and (
            user.pk not in hub.registry.accounts.members
        )

    assert await eventually(left)
    await sockets.close(keep)
    assert hub.registry.connections == set()
    assert hub.tasks.running == []  # stopped with the last socket
