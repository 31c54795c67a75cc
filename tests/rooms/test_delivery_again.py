"""A room's changes delivered while a view was being read (its room_state): that view gets them
again a window later, and only it: the views sent them are not resolved again (a burst's second
batch of joiners, being read while the first batch was delivered, had every view of the room
resolve the first batch twice)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from presence.hub import rooms as hub_rooms
from presence.hub.groups import Groups
from presence.hub.registry import Registry, View
from presence.hub.rooms import RoomViews
from presence.models import PrivacySettings
from presence.store import get_store, merge
from tests.live.sockets import eventually
from tests.rooms.rules import ROOMS
from tests.rooms.test_fanout import Viewer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.uuid_site]

ROOM = "post:1"


@sync_to_async
def users(count: int, prefix: str) -> list[Any]:
    made = [get_user_model().objects.create_user(username=f"{prefix}{n}") for n in range(count)]
    for user in made:
        PrivacySettings.objects.create(user=user, online_visibility="everyone")
    return made


async def test_changes_go_again_only_to_the_views_being_read_when_delivered(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS, "COALESCE_WINDOW": 0.05}
    members, watchers = await users(3, "m"), await users(4, "v")
    store = get_store()
    now = time.time()
    await store.arun(merge([store.plans.connection(u.pk, "open", now, "c") for u in members]))
    await store.arun(merge([store.plans.join_room(ROOM, u.pk, "c", now) for u in members]))
    registry = Registry()
    rooms = RoomViews(registry, Groups(None, registry))
    connections = [Viewer(user) for user in watchers]
    reading = connections[0]
    for connection in connections:
        registry.rooms.add(connection, ROOM)  # type: ignore[arg-type]
        view = View(reading=connection is reading)  # its room_state is being read
        rooms.views[connection] = {ROOM: view}  # type: ignore[index]
    asked: list[set[Any]] = []
    real_delta = hub_rooms.aroom_delta

    async def seen(room: Any, viewers: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(set(viewers))
        return await real_delta(room, viewers, *args, **kwargs)

    monkeypatch.setattr(hub_rooms, "aroom_delta", seen)
    running = True
    task = asyncio.ensure_future(rooms.run(lambda: running))
    try:
        rooms.changed(ROOM, [u.pk for u in members], None)
        assert await eventually(lambda: all(c.frames for c in connections[1:]))
        assert not reading.frames
        assert asked == [{c.viewer_id for c in connections[1:]}]
        # Read meanwhile (before the members joined, say): once shown, it gets them too.
        rooms.views[reading][ROOM].reading = False  # type: ignore[index]
        assert await eventually(lambda: reading.frames)
        (frame,) = reading.frames
        assert sorted(frame["joins"]) == sorted(str(u.pk) for u in members)
        # The second delivery read the changes for that view alone; the others were sent
        # them once.
        assert asked[1:] == [{reading.viewer_id}]
        assert [len(c.frames) for c in connections[1:]] == [1, 1, 1]
        # News for the room goes to every view again.
        await store.arun(store.plans.join_room(ROOM, watchers[3].pk, "c", time.time()))
        rooms.changed(ROOM, [watchers[3].pk], None)
        assert await eventually(lambda: len(asked) == 3)
        assert asked[2] == {c.viewer_id for c in connections}
    finally:
        running = False
        rooms.windows._wake.set()
        await asyncio.wait_for(task, 10)
