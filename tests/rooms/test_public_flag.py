"""A member's public flag in a room (whether their online status is shown to everyone: the
index a stranger's read goes through) is written by their socket's join from their choices,
and follows a change of their privacy while they are in the room (the change announced, each
of their connections writes its rooms' flags again), and a viewer who read the room before
the flag was written is told when it is. Real Redis, channel layer and sockets."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from presence import api
from presence.hub import Hub
from presence.models import PrivacySettings
from presence.store import get_store
from tests.live.sockets import BASE, TIMEOUT, Sockets, eventually, new_user, receive
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


async def test_a_viewer_who_read_the_room_before_the_flag_lists_the_member(
    sockets: Sockets, make_user: Callable
) -> None:
    """A member shows their online status to everyone from now on. Their socket's process
    writes their rooms' public flag when it hears of the change, maybe after the viewers'
    processes were told (on a busy site: its channel, its database thread, a renewal holding
    the rooms' lock). A stranger who reads the room in between goes through the index without
    them, and no change of theirs comes later: the flag's write is what tells the room."""
    alice, stranger = [await new_user(make_user) for _ in range(2)]
    a = await sockets.open(alice)
    await a.send_json_to({"type": "join", "room": ROOM, "meta": None})
    assert (await receive(a))["type"] == "room_state"
    assert await public_members() == set()  # the default, contacts: out of the index

    hub = Hub.current()
    assert hub is not None
    (rooms,) = [r for c, r in hub.registry.rooms.joined.items() if c.viewer_id == alice.pk]
    windows = hub.rooms.windows
    # A renewal of alice's rooms under way holds their lock: the flag waits for it.
    await rooms.lock.acquire()
    try:
        everyone = sync_to_async(PrivacySettings.objects.create)
        await everyone(user=alice, online_visibility="everyone")
        # The change reached the hub (alice's flag waits for the lock) and the room's window
        # of it was delivered, to no viewer yet.
        assert await eventually(lambda: bool(getattr(rooms.lock, "_waiters", None)))
        assert await eventually(lambda: ROOM not in windows.pending and not windows.delivering)
        assert await public_members() == set()
        s = await sockets.open(stranger)
        await s.send_json_to({"type": "join", "room": ROOM, "meta": None})
        state = await receive(s)
        # What a read through the index finds now: alice counted, not listed.
        assert (list(state["members"]), state["others"], state["count"]) == (
            [str(stranger.pk)],
            1,
            2,
        )
    finally:
        rooms.lock.release()
    await until_public({str(alice.pk)})
    frame = await s.receive_json_from(timeout=TIMEOUT)
    assert frame["type"] == "room_diff"
    assert (list(frame["joins"]), frame["leaves"], frame["others"], frame["count"]) == (
        [str(alice.pk)],
        [],
        0,
        2,
    )
    fresh = await sync_to_async(api.room_presence)(ROOM, stranger)
    assert (set(fresh["members"]), fresh["others"]) == ({str(alice.pk), str(stranger.pk)}, 0)
