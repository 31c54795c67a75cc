"""The feed's live timelines when the channel layer fails: a process joins the feed's topic group
once, for its first watcher, so a join that failed, or a group the layer lost, must be joined
again (docs/reliability.md: "its hub joins all its groups again").

The layer's servers are these tests' own (tools/redis_server.py), stopped at the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from presence import lifecycle
from presence.feed import api as feed
from presence.models import Contact
from presence.routing import websocket_urlpatterns
from presence.store import get_store
from tools.redis_server import RedisServer

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
]

CORE = "channels_redis.core.RedisChannelLayer"
#: the hub sweeps often and waits little after a failed layer call (reliability.md's timings,
#: shortened): waits below end as soon as what must come came
FAST_RECOVERY = {
    "COALESCE_WINDOW": 0.05,
    "SWEEP_INTERVAL": 0.2,
    "OFFLINE_GRACE": 1,
    "RETRY_INTERVAL": 0.3,
}
#: how long a frame that must come may take (generous: a machine saturated by other work)
TIMEOUT = 10
#: how long views may take to recover once the layer is back (RETRY_INTERVAL and sweeps)
CONVERGE = 20

post = sync_to_async(feed.post)


@pytest.fixture
def layer_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def core_layer(url: str) -> dict[str, Any]:
    return {"default": {"BACKEND": CORE, "CONFIG": {"hosts": [url]}}}


def followers_of(author: Any, *viewers: Any) -> None:
    for viewer in viewers:
        Contact.objects.create(owner=viewer, contact=author)
        Contact.objects.create(owner=author, contact=viewer)  # it lets its contacts see it


async def open_socket(user: Any) -> WebsocketCommunicator:
    socket = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/ws/presence/")
    socket.scope["user"] = user
    assert (await socket.connect(timeout=TIMEOUT))[0]
    return socket


async def next_frame(socket: WebsocketCommunicator, kind: str, seconds: float) -> dict[str, Any]:
    """The next frame of type ``kind`` within ``seconds`` (others are skipped)."""
    async with asyncio.timeout(seconds):
        while True:
            # receive_nothing peeks; a receive that times out would cancel the consumer.
            if await socket.receive_nothing(timeout=0.05):
                continue
            frame: dict[str, Any] = await socket.receive_json_from(timeout=TIMEOUT)
            if frame["type"] == kind:
                return frame


async def watch_feed_and(socket: WebsocketCommunicator, users: list[Any]) -> None:
    await socket.send_json_to({"type": "watch_feed", "feed": "following"})
    # Frames are handled in order: an answered subscribe means the watch was.
    await socket.send_json_to({"type": "subscribe", "users": [u.pk for u in users]})
    assert (await next_frame(socket, "presence_state", TIMEOUT))["type"] == "presence_state"


async def activity_after_recovery(socket: WebsocketCommunicator, author: Any) -> str:
    """Once the author's coming online reached ``socket`` (its user group joined again), the
    text of the first of the author's posts to reach it."""
    await lifecycle.aconnect(author, "c1")
    await next_frame(socket, "presence_diff", CONVERGE)
    await post(author, "after")
    return str((await next_frame(socket, "activity", TIMEOUT))["activity"]["text"])


def test_the_feed_reaches_its_watcher_again_after_the_layer_server_restarts_empty(
    layer_server: RedisServer, make_user: Callable[..., Any]
) -> None:
    viewer, author = make_user(username="viewer"), make_user(username="author")
    followers_of(author, viewer)

    async def scenario() -> None:
        socket = await open_socket(viewer)
        try:
            await watch_feed_and(socket, [author])
            await post(author, "before")
            assert (await next_frame(socket, "activity", TIMEOUT))["activity"]["text"] == "before"

            # Back empty (nothing kept on disk): the core layer's groups were keys in it.
            layer_server.stop()
            layer_server.start()
            assert await activity_after_recovery(socket, author) == "after"
        finally:
            await socket.disconnect(timeout=TIMEOUT)
            await get_store().aclose()

    with override_settings(CHANNEL_LAYERS=core_layer(layer_server.url), PRESENCE=FAST_RECOVERY):
        async_to_sync(scenario)()


def test_a_feed_watched_while_the_layer_is_down_is_joined_once_it_is_back(
    layer_server: RedisServer, make_user: Callable[..., Any]
) -> None:
    viewer, author = make_user(username="viewer"), make_user(username="author")
    followers_of(author, viewer)

    async def scenario() -> None:
        socket = await open_socket(viewer)
        try:
            layer_server.stop()
            await watch_feed_and(socket, [author])  # the feed's group_add fails
            layer_server.start()
            assert await activity_after_recovery(socket, author) == "after"
        finally:
            await socket.disconnect(timeout=TIMEOUT)
            await get_store().aclose()

    with override_settings(CHANNEL_LAYERS=core_layer(layer_server.url), PRESENCE=FAST_RECOVERY):
        async_to_sync(scenario)()
