"""presence.announce on the real channels_redis core layer: many announcements at once stay
within the layer's connection pool, and an announcement the layer refused is sent again once
the layer is back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import get_channel_layer
from django.test import override_settings

from presence import announce
from presence.announce import CHANGED, group_name
from presence.users import encode_id
from tools.redis_server import RedisServer

CORE = "channels_redis.core.RedisChannelLayer"


def core_layer(server: RedisServer) -> dict[str, Any]:
    # As the site's: room for bursts on the hub's channel (the default capacity is 100).
    config = {"hosts": [server.url], "channel_capacity": {"specific.*": 10000}}
    return {"default": {"BACKEND": CORE, "CONFIG": config}}


@pytest.fixture
def layer_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


async def received(layer: Any, channel: str, count: int, seconds: float) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    async with asyncio.timeout(seconds):
        while len(messages) < count:
            messages.append(await layer.receive(channel))
    return messages


def test_many_announcements_at_once_stay_within_the_layers_pool(
    layer_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    # channels_redis draws a connection per call from a pool that refuses a 101st ("Too many
    # connections"): 300 at once must all be sent, none lost.
    users = list(range(1, 301))
    layers = core_layer(layer_server)

    async def scenario() -> list[dict[str, Any]]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        for user in users:
            await layer.group_add(group_name(user), channel)
        await asyncio.gather(*(announce.aannounce([user]) for user in users))
        try:
            return await received(layer, channel, len(users), 10)
        finally:
            await layer.flush()

    caplog.set_level(logging.WARNING, logger="presence")
    with override_settings(CHANNEL_LAYERS=layers):
        from asgiref.sync import async_to_sync

        messages = async_to_sync(scenario)()
    assert sorted(int(m["users"][0]) for m in messages) == users
    assert {m["type"] for m in messages} == {CHANGED}
    assert not [r for r in caplog.records if "could not announce" in r.getMessage()]


def test_an_announcement_the_layer_refused_is_sent_again_once_it_is_back(
    layer_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    layers = core_layer(layer_server)

    async def scenario() -> list[dict[str, Any]]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        layer_server.stop()
        failures = announce.layer_failures
        await announce.aannounce([7])  # refused: the layer's Redis is down
        assert announce.layer_failures == failures + 1
        # Meanwhile user 7's connection writes here leave them unsettled (lua/connection.lua).
        assert announce.retrying(7) and not announce.retrying(8)
        layer_server.start()
        # Back, and empty: the group is joined again (as the hub does after failures).
        await layer.group_add(group_name(7), channel)
        try:
            messages = await received(layer, channel, 1, 10)
        finally:
            await layer.flush()
        for _ in range(100):  # the retry ends once its message is out
            if not announce.retrying(7):
                break
            await asyncio.sleep(0.01)
        assert not announce.retrying(7)
        return messages

    caplog.set_level(logging.WARNING, logger="presence")
    with (
        override_settings(CHANNEL_LAYERS=layers, PRESENCE={"RETRY_INTERVAL": 0.2}),
    ):
        from asgiref.sync import async_to_sync

        messages = async_to_sync(scenario)()
    (message,) = messages
    assert message["type"] == CHANGED and message["users"] == [encode_id(7)]
    # Sent again with the time it was sent again: its viewers' windows start anew.
    assert isinstance(message["at"], float)
    assert [r.getMessage() for r in caplog.records if "could not announce" in r.getMessage()]


def test_a_rooms_announcements_made_meanwhile_go_in_few_messages_none_lost(
    layer_server: RedisServer,
) -> None:
    # A burst of 300 joins on one process: each join's "changed in room R" once sent, its
    # caller goes on; those made while the room's previous message was being sent go with the
    # next one (presence.room_sends), every user in some message.
    users = list(range(1, 301))
    layers = core_layer(layer_server)
    room = "lobby:burst"

    async def scenario() -> tuple[list[dict[str, Any]], list[float]]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(announce.room_group_name(room), channel)
        sent: list[float] = []

        async def join(user: int) -> None:
            with announce.change_started_at(1000.0 + user):
                await announce.aannounce_room(room, [user])
            sent.append(user)

        await asyncio.gather(*(join(user) for user in users))
        try:
            messages = [await layer.receive(channel)]
            with pytest.raises(TimeoutError):
                while True:
                    async with asyncio.timeout(0.5):
                        messages.append(await layer.receive(channel))
            return messages, sent
        finally:
            await layer.flush()

    with override_settings(CHANNEL_LAYERS=layers, PRESENCE={"ROOMS": {"lobby": None}}):
        from asgiref.sync import async_to_sync

        messages, sent = async_to_sync(scenario)()
    assert sorted(sent) == users  # every caller returned
    announced = [int(uid) for message in messages for uid in message["users"]]
    assert sorted(announced) == users
    # The first alone (nothing to wait for), the rest together: not a message per join.
    assert len(messages) <= 3, [len(m["users"]) for m in messages]
    assert {m["type"] for m in messages} == {announce.ROOM}
    # Each message's time is the earliest change in it (windows count from the first).
    assert [m["at"] for m in messages] == [1000.0 + int(m["users"][0]) for m in messages]
