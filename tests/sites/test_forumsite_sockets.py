"""The forum's topic rooms live (tests.settings.forum, `make test`'s forum_site run): sockets
opened through the forum's own ASGI application (tests/sites/forumsite/asgi.py, the README's),
signed in by their session cookies, on the real channels_redis layer and a real Redis. A private
topic's room admits its participants only (the forum's rule), shows each member by the forum's card
(name and avatar), and drops a participant the topic's author removes at once
(``api.recheck_room``), long before the rule's periodic check (the clock stands still)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client
from django.urls import reverse

from tests.live.sockets import (
    BASE,
    TIMEOUT,
    Sockets,
    _asgi_headers,
    _session_cookie,
    assert_silent,
    open_sockets,
    receive,
    state,
    subscribe,
)
from tests.rooms.test_sockets import ClientView, join
from tests.sites.forumsite import people

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.forum_site,
]

#: the forum's own PRESENCE, with the socket tests' short coalescing window and no hub sweep
SITE_PRESENCE = dict(django_settings.PRESENCE)


@pytest.fixture(autouse=True)
def _settings(settings: Any, tmp_path: Path) -> None:
    settings.PRESENCE = {**SITE_PRESENCE, **BASE}
    settings.MEDIA_ROOT = str(tmp_path / "media")


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    async for opened in open_sockets():
        yield opened


@pytest.fixture
async def forum(_settings: None, clock: time_machine.Coordinates) -> dict[str, Any]:
    return await sync_to_async(people.forum)()


async def through_the_forum(sockets: Sockets, user: Any) -> WebsocketCommunicator:
    """A socket of the forum's ASGI application, as a page of the forum opens it."""
    from tests.sites.forumsite.asgi import application

    cookie = await sync_to_async(_session_cookie)(user)
    headers = _asgi_headers(b"http://testserver", cookie)
    communicator = sockets.make(..., headers=headers, app=application)
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    assert await subscribe(communicator) == state({})
    return communicator


def card(user: Any) -> dict[str, Any]:
    return {"name": user.get_full_name(), "avatar": f"/media/avatars/{user.username}.png"}


async def test_participants_see_each_other_arrive_with_their_cards(
    sockets: Sockets, forum: dict[str, Any]
) -> None:
    ann, ben = forum["ann"], forum["ben"]
    room = f"topic:{forum['private'].pk}"
    a = await through_the_forum(sockets, ann)
    seen = ClientView(await join(a, room))
    assert seen.members[str(ann.pk)]["card"] == card(ann)
    b = await through_the_forum(sockets, ben)
    bens = await join(b, room)
    assert {key: member["card"] for key, member in bens["members"].items()} == {
        str(ann.pk): card(ann),
        str(ben.pk): card(ben),
    }
    await seen.until(a, {str(ann.pk), str(ben.pk)}, 0)  # from ann's room_diff
    arrived = seen.members[str(ben.pk)]
    assert arrived["card"] == {"name": "Ben Ito", "avatar": "/media/avatars/ben.png"}
    assert arrived["presence"]["status"] == "online"
    assert seen.count == 2


async def test_a_non_participant_is_refused_and_not_counted(
    sockets: Sockets, forum: dict[str, Any]
) -> None:
    ann, cy = forum["ann"], forum["cy"]
    room = f"topic:{forum['private'].pk}"
    a = await through_the_forum(sockets, ann)
    await join(a, room)
    c = await through_the_forum(sockets, cy)
    refused = await join(c, room)
    assert refused == {
        "type": "error",
        "code": "forbidden",
        "message": f"You may not enter the room {room}.",
        "room": room,
        "answers": "join",
    }
    await assert_silent(a)  # ann's view neither lists nor counts him
    # The public topic's room lets him in, the socket still open.
    public = await join(c, f"topic:{forum['public'].pk}")
    assert public["type"] == "room_state" and public["count"] == 1


async def test_a_removed_participant_is_dropped_at_once(
    sockets: Sockets, forum: dict[str, Any]
) -> None:
    ann, ben = forum["ann"], forum["ben"]
    private = forum["private"]
    room = f"topic:{private.pk}"
    a = await through_the_forum(sockets, ann)
    seen = ClientView(await join(a, room))
    b = await through_the_forum(sockets, ben)
    await join(b, room)
    await seen.until(a, {str(ann.pk), str(ben.pk)}, 0)

    def remove_ben() -> int:
        client = Client()
        client.force_login(ann)
        url = reverse("remove_participant", args=[private.pk, ben.pk])
        return client.post(url).status_code

    assert await sync_to_async(remove_ben)() == 302
    # The clock stands still: no periodic check came due; recheck_room asked the rule at once.
    dropped = await receive(b)
    assert dropped["type"] == "error" and dropped["code"] == "forbidden"
    assert dropped["room"] == room
    await seen.until(a, {str(ann.pk)}, 0)
    assert seen.count == 1
    assert not await private.participants.filter(pk=ben.pk).aexists()
