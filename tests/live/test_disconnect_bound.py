"""A closed socket's handler ends within LIVE_SOCKET_TIMEOUT of its close, however slow Redis or
the database is: ASGI servers kill handlers that take longer (daphne: 10 s), logging each one.

Its sign-off write goes on in the background (shielded); one that never lands is crash
detection's (the connection's TTL, the sweep).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async

from tests.live.sockets import Sockets, new_user, presence_settings
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
]

LIVE = 0.5


async def ends_by_itself(sockets: Sockets, communicator: Any, seconds: float) -> bool:
    """Whether the consumer's handler ended within ``seconds`` of the close, rather than being
    cancelled then (as the communicator does, like an ASGI server killing it)."""
    sockets.opened.remove(communicator)
    await communicator.disconnect(timeout=seconds)
    return not communicator.future.cancelled()


async def test_a_close_ends_its_handler_while_redis_is_paused(
    sockets: Sockets, make_user: Callable[..., Any], private_redis: Any
) -> None:
    with presence_settings(LIVE_SOCKET_TIMEOUT=LIVE, SOCKET_TIMEOUT=LIVE):
        user = await new_user(make_user)
        communicator = await sockets.open(user)
        client = redis.Redis.from_url(private_redis.url)
        client.client_pause(int(LIVE * 10 * 1000))  # cut short by the unpause below
        try:
            assert await ends_by_itself(sockets, communicator, LIVE * 4)
        finally:
            client.client_unpause()
            client.close()


async def test_a_close_ends_its_handler_while_the_database_thread_is_busy(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    with presence_settings(LIVE_SOCKET_TIMEOUT=LIVE):
        user = await new_user(make_user)
        communicator = await sockets.open(user)
        release = threading.Event()
        # The one thread every sync_to_async database call shares, busy (a storm's queries).
        busy = asyncio.ensure_future(sync_to_async(release.wait)(30))
        try:
            assert await ends_by_itself(sockets, communicator, LIVE * 4)
        finally:
            release.set()
            await busy
