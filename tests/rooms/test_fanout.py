"""One window of a room's fan-out (presence.hub.rooms with api.aroom_delta): every viewer's
view ends as a fresh read for that viewer says, and the resolver runs once per (changed user,
relation), not once per (viewer, member): a big room's window is not O(members²)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from presence import api, domain
from presence.api import _room_events as events
from presence.hub.groups import Groups
from presence.hub.registry import Registry
from presence.hub.rooms import RoomViews, View
from presence.models import Block, Contact, PrivacySettings
from presence.store import get_store, merge
from tests.rooms.rules import ROOMS

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.uuid_site, pytest.mark.cluster]

ROOM = "post:1"


class Viewer:
    """A connection as the hub sees it, keeping what it is sent."""

    def __init__(self, user: Any) -> None:
        self.user = user
        self.viewer_id = user.pk
        self.frames: list[dict[str, Any]] = []

    async def send_json(self, content: dict[str, Any]) -> None:
        self.frames.append(content)


@sync_to_async
def population() -> tuple[list[Any], list[Any]]:
    User = get_user_model()
    members = [User.objects.create_user(username=f"m{n}") for n in range(40)]
    viewers = [User.objects.create_user(username=f"v{n}") for n in range(20)]
    for member in members[::2]:
        PrivacySettings.objects.create(user=member, online_visibility="everyone")
    PrivacySettings.objects.create(user=members[1], invisible=True)
    for member in members[3:12:2]:
        Contact.objects.create(owner=member, contact=viewers[0])  # viewer 0 sees these
    Contact.objects.create(owner=viewers[1], contact=members[5])  # viewer 1 follows one
    Block.objects.create(blocker=members[0], blocked=viewers[2])
    Block.objects.create(blocker=viewers[3], blocked=members[2])
    return members, viewers


async def test_a_window_brings_every_view_to_a_fresh_read(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 100}
    members, viewers = await population()
    store = get_store()
    now = time.time()
    invisible = {members[1].pk}
    await store.arun(merge([store.plans.connection(u.pk, "open", now, "c") for u in members]))
    await store.arun(
        merge(
            [store.plans.join_room(ROOM, u.pk, "c", now, None, u.pk in invisible) for u in members]
        )
    )
    registry = Registry()
    rooms = RoomViews(registry, Groups(None, registry))
    connections = [Viewer(user) for user in viewers]
    for connection in connections:
        registry.rooms.add(connection, ROOM)  # type: ignore[arg-type]
        rooms.views[connection] = {ROOM: View(reading=False)}  # type: ignore[index]
    resolved = []
    real_resolve = domain.resolve

    def counting(*args: Any) -> Any:
        resolved.append(args[0])
        return real_resolve(*args)

    monkeypatch.setattr(events.domain, "resolve", counting)
    await rooms.deliver(ROOM, {u.pk for u in members})
    monkeypatch.setattr(events.domain, "resolve", real_resolve)
    # Once per (member, relation): strangers share; ties are few.
    assert len(resolved) <= len(members) + 10
    for connection in connections:
        (frame,) = connection.frames
        view = rooms.views[connection][ROOM]  # type: ignore[index]
        fresh = await api.aroom_presence(ROOM, connection.user)
        assert {str(uid) for uid in view.listed} == set(fresh["members"]), connection.user
        assert frame["count"] == fresh["count"]
        assert frame["others"] == fresh["others"]
    by_viewer = {c.user: c.frames[0] for c in connections}
    # The blocked viewer does not count the member blocking them; the invisible member is
    # counted by nobody.
    assert by_viewer[viewers[2]]["count"] == by_viewer[viewers[4]]["count"] - 1
    assert by_viewer[viewers[4]]["count"] == len(members) - 1
    assert str(members[0].pk) not in by_viewer[viewers[2]]["joins"]
    assert len(by_viewer[viewers[0]]["joins"]) == len(by_viewer[viewers[4]]["joins"]) + 5
