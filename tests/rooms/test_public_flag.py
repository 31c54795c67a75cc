"""A member's public flag in a room (whether their online status is shown to everyone: the
index a stranger's read goes through) is written by their socket's join from their choices,
and follows a change of their privacy while they are in the room (the change announced, each
of their connections writes its rooms' flags again). Real Redis, channel layer and sockets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from presence import api
from presence.models import PrivacySettings
from presence.store import get_store
from tests.live.sockets import BASE, Sockets, new_user, receive
from tests.live.sockets import sockets as sockets
from tests.rooms.rules import ROOMS

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]

ROOM = "post:1"


@pytest.fixture(autouse=True)
def _room_settings(settings: Any) -> None:
    settings.PRESENCE = {**BASE, "ROOMS": ROOMS}


async def public_members() -> set[str]:
    """The room's public members, as its index holds them."""
    store = get_store()
    plan = store.plans.read_room(ROOM, time.time(), 100, (), public_only=True)
    read = await store.arun(plan)
    assert read is not None
    return {str(uid) for uid in read.members}


async def until_public(expected: set[str]) -> None:
    for _ in range(200):  # the change reaches the hub through the channel layer
        if await public_members() == expected:
            return
        await asyncio.sleep(0.02)
    assert await public_members() == expected


async def test_the_flag_follows_the_members_choice(sockets: Sockets, make_user: Callable) -> None:
    alice, bob, stranger = [await new_user(make_user) for _ in range(3)]
    await sync_to_async(PrivacySettings.objects.create)(user=bob, online_visibility="everyone")
    a, b = await sockets.open(alice), await sockets.open(bob)
    for socket in (a, b):
        await socket.send_json_to({"type": "join", "room": ROOM, "meta": None})
        assert (await receive(socket))["type"] == "room_state"
    # alice keeps the default (contacts): out of the index, and a stranger does not see her
    assert await public_members() == {str(bob.pk)}
    state = await sync_to_async(api.room_presence)(ROOM, stranger)
    assert (list(state["members"]), state["count"]) == ([str(bob.pk)], 2)

    await sync_to_async(PrivacySettings.objects.create)(user=alice, online_visibility="everyone")
    await until_public({str(alice.pk), str(bob.pk)})
    state = await sync_to_async(api.room_presence)(ROOM, stranger)
    assert list(state["members"]) == [str(alice.pk), str(bob.pk)]

    await sync_to_async(PrivacySettings.objects.filter(user=bob).update)(online_visibility="nobody")
    # (an update() sends no post_save: the site announces it, as docs/api.md says)
    await sync_to_async(api.notify_changed)([bob])
    await until_public({str(alice.pk)})
    state = await sync_to_async(api.room_presence)(ROOM, stranger)
    assert (list(state["members"]), state["count"]) == ([str(alice.pk)], 2)
