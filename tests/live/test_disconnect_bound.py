"""A closed socket's handler ends within LIVE_SOCKET_TIMEOUT of its close, however slow Redis or
the database is: ASGI servers kill handlers that take longer (daphne: 10 s), logging each one.

What is left of its cleanup then (the hub and rooms left, the sign-off) goes on in a task of
its own; a sign-off that never lands is crash detection's (the connection's TTL, the sweep).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async

from presence.store import get_store

from tests.live.sockets import Sockets, eventually, new_user, presence_settings
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


async def test_a_close_slower_than_its_wait_still_signs_off_after_its_handler_ended(
    sockets: Sockets, make_user: Callable[..., Any], private_redis: Any
) -> None:
    # Redis paused for longer than the handler may take: the handler ends, and the close's
    # cleanup (the hub left, then the sign-off) goes on once Redis answers, rather than being
    # lost with a handler the server kills half-way.
    with presence_settings(LIVE_SOCKET_TIMEOUT=LIVE, SOCKET_TIMEOUT=LIVE):
        user = await new_user(make_user)
        communicator = await sockets.open(user)
        store = get_store()
        assert (await store.arun(store.plans.read([user.pk])) or {})[user.pk].connected
        client = redis.Redis.from_url(private_redis.url)
        client.client_pause(int(LIVE * 3 * 1000), all=False)  # writes wait; reads answer
        try:
            assert await ends_by_itself(sockets, communicator, LIVE * 2.5)
        finally:
            client.client_unpause()
            client.close()

        async def signed_off() -> bool:
            states = await store.arun(store.plans.read([user.pk])) or {}
            return user.pk in states and not states[user.pk].connected

        assert await eventually(signed_off, timeout=LIVE * 10)
