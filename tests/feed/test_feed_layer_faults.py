"""The feed's live timelines when the channel layer fails: a process joins the feed's topic group
once, for its first watcher, so a join that failed, or a group the layer lost, must be joined
again (docs/reliability.md: "its hub joins all its groups again"); and a socket whose watch
was answered gets what is posted from then on, even while the process's join of the group,
made for another socket, is still on its way.

The layer's servers are these tests' own (tools/redis_server.py), stopped at the end; the slow
join goes through a small proxy of the test's own in front of one (127.0.0.1, a free port).
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
from presence.feed.live import KIND
from presence.layer import topic_group_name
from presence.models import Contact
from presence.routing import websocket_urlpatterns
from presence.store import get_store
from tools.redis_server import RedisServer, free_port

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
#: how long a join of the feed's group is held on its way to the layer
HOLD = 0.5

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


def test_an_activity_posted_while_the_layer_is_down_reaches_its_watcher_once_it_is_back(
    layer_server: RedisServer, make_user: Callable[..., Any]
) -> None:
    """The feed's announcement of a post is sent again after RETRY_INTERVAL (doubling) when the
    layer fails it, as a presence change's is: not dropped for good."""
    viewer, author = make_user(username="viewer"), make_user(username="author")
    followers_of(author, viewer)

    async def scenario() -> None:
        socket = await open_socket(viewer)
        try:
            await watch_feed_and(socket, [author])
            layer_server.stop()
            await post(author, "during the outage")
            layer_server.start()
            activity = await next_frame(socket, "activity", CONVERGE)
            assert activity["activity"]["text"] == "during the outage"
        finally:
            await socket.disconnect(timeout=TIMEOUT)
            await get_store().aclose()

    with override_settings(CHANNEL_LAYERS=core_layer(layer_server.url), PRESENCE=FAST_RECOVERY):
        async_to_sync(scenario)()


class SlowJoins:
    """A TCP proxy on 127.0.0.1 in front of a Redis server, on the test's event loop: while
    ``holding``, what a client sends that joins ``group`` (a ZADD naming its key) is held HOLD
    seconds on its way; ``held`` is set once it was."""

    def __init__(self, upstream_port: int, group: str) -> None:
        self.upstream_port, self.group = upstream_port, group.encode()
        self.port = free_port()
        self.holding = False
        self.held = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        for pump in (self._pump(reader, up_writer, True), self._pump(up_reader, writer, False)):
            task = asyncio.ensure_future(pump)
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    def _joins(self, data: bytes) -> bool:
        # A send to the group reads the group's key too, with no ZADD: it is not held.
        return b"ZADD" in data and self.group in data

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, from_client: bool
    ) -> None:
        try:
            while data := await reader.read(65536):
                if from_client and self.holding and self._joins(data):
                    self.held.set()
                    await asyncio.sleep(HOLD)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


def test_a_second_watcher_gets_what_is_posted_once_its_watch_is_answered(
    layer_server: RedisServer, make_user: Callable[..., Any]
) -> None:
    """Two sockets of one process watch a feed at once: the second's watch is answered only
    once the process's join of the feed's group (the first's, still on its way) has landed;
    answered earlier, a post made then would never reach it."""
    first, second = make_user(username="first"), make_user(username="second")
    author = make_user(username="author")
    followers_of(author, first, second)
    proxy = SlowJoins(layer_server.port, topic_group_name(KIND))

    async def scenario() -> None:
        await proxy.start()
        sockets = []
        try:
            sockets = [await open_socket(first), await open_socket(second)]
            proxy.holding = True
            await sockets[0].send_json_to({"type": "watch_feed", "feed": "following"})
            # The process's join of the feed's group, for the first socket, is on its way.
            await asyncio.wait_for(proxy.held.wait(), TIMEOUT)
            await watch_feed_and(sockets[1], [])
            await post(author, "hello")
            activity = await next_frame(sockets[1], "activity", TIMEOUT)
            assert activity["activity"]["text"] == "hello"
        finally:
            proxy.holding = False
            for socket in sockets:
                await socket.disconnect(timeout=TIMEOUT)
            await get_store().aclose()
            await proxy.stop()

    url = f"redis://127.0.0.1:{proxy.port}/0"
    with override_settings(CHANNEL_LAYERS=core_layer(url)):
        async_to_sync(scenario)()
