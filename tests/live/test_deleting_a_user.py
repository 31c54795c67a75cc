"""Deleting a user removes their presence at once (issue 34, the contract's Statuses): no longer
online or counted, out of every room, their sockets closed with 4401, ``user_offline`` sent
once, those watching them shown them offline; nobody else's state changes.

Real sockets (WebsocketCommunicator, token-authenticated as a site's sockets are), the real
channel layer and Redis (a cluster in the cluster run). Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.db import transaction

from presence import api, lifecycle, signals
from presence.domain import LiveState
from presence.models import Contact, PrivacySettings
from presence.rooms import live
from presence.rooms.writes import asweep_rooms
from presence.routing import websocket_urlpatterns
from presence.store import get_store
from presence.tokens import TokenAuthMiddleware, issue_token
from tests.clock import at
from tests.live.sockets import (
    BASE,
    HIDDEN,
    TIMEOUT,
    Sockets,
    _asgi_headers,
    assert_closed_with,
    assert_silent,
    new_user,
    online,
    receive,
    state,
    subscribe,
)
from tests.live.sockets import sockets as sockets
from tests.rooms.rules import ROOMS
from tests.rooms.test_room_signals import room_signals, sent

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]

ROOM = "post:1"

__all__ = ["room_signals"]  # the fixture, imported
TOKEN_APP = AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))


@pytest.fixture(autouse=True)
def _room_settings(settings: Any) -> None:
    settings.PRESENCE = {**BASE, "ROOMS": ROOMS, "OFFLINE_GRACE": 5, "CONNECTION_TTL": 90}


@pytest.fixture
def offline_signals() -> Iterator[list[Any]]:
    """The user ids user_offline was sent for in this test (user_online: as ("online", id))."""
    got: list[Any] = []

    def on_online(sender: Any, user_id: Any, **kwargs: Any) -> None:
        got.append(("online", user_id))

    def on_offline(sender: Any, user_id: Any, **kwargs: Any) -> None:
        got.append(user_id)

    signals.user_online.connect(on_online)
    signals.user_offline.connect(on_offline)
    yield got
    signals.wait_sent()
    signals.user_online.disconnect(on_online)
    signals.user_offline.disconnect(on_offline)


async def token_socket(sockets: Sockets, user: Any) -> WebsocketCommunicator:
    """A socket authenticated by a bearer token (re-checked like a session's)."""
    token = await sync_to_async(issue_token)(user)
    headers = [*_asgi_headers(None, None), (b"authorization", f"Bearer {token}".encode())]
    communicator = sockets.make(..., headers=headers, app=TOKEN_APP)
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    assert await subscribe(communicator) == state({})
    return communicator


async def join(communicator: WebsocketCommunicator) -> dict[str, Any]:
    await communicator.send_json_to({"type": "join", "room": ROOM, "meta": None})
    return await receive(communicator)


@sync_to_async
def public(*users: Any) -> None:
    for user in users:
        PrivacySettings.objects.create(
            user=user, online_visibility="everyone", last_seen_visibility="everyone"
        )


async def live_facts(*users: Any) -> tuple[Any, ...]:
    """What Redis holds of these users: their live state and their connections."""
    store = get_store()
    states = await store.arun(store.plans.read([u.pk for u in users]))
    connections = [await store.arun(store.plans.describe_connections(u.pk)) for u in users]
    return states, connections


async def sent_offline(got: list[Any]) -> list[Any]:
    await asyncio.to_thread(signals.wait_sent)
    return list(got)


class RoomView:
    """A room as a client keeps it from room_state and room_diff frames (as presence.js does)."""

    def __init__(self, frame: dict[str, Any]) -> None:
        assert frame["type"] == "room_state", frame
        self.members, self.count = set(frame["members"]), frame["count"]

    def apply(self, frame: dict[str, Any]) -> None:
        assert frame["type"] == "room_diff", frame
        self.members = (self.members - set(frame["leaves"])) | set(frame["joins"])
        self.count = frame["count"]

    def shows(self, users: set[Any], count: int) -> bool:
        return self.members == {str(u.pk) for u in users} and self.count == count

    async def until(
        self, socket: WebsocketCommunicator, users: set[Any], count: int
    ) -> list[dict[str, Any]]:
        """Apply the room's frames until the view shows ``users`` and ``count`` (at most
        five); the other frames that came meanwhile."""
        others = []
        for _ in range(5):
            if self.shows(users, count):
                break
            frame = await receive(socket)
            if frame["type"] == "room_diff":
                self.apply(frame)
            else:
                others.append(frame)
        assert self.shows(users, count), (self.members, self.count)
        return others


async def test_a_deleted_users_presence_goes_at_once(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    offline_signals: list[Any],
    room_signals: list[Any],
) -> None:
    doomed, friend, bystander = [await new_user(make_user) for _ in range(3)]
    doomed_id = doomed.pk
    await public(doomed, bystander)
    await sync_to_async(Contact.objects.create)(owner=friend, contact=bystander)
    watching = await token_socket(sockets, friend)
    first, second = await token_socket(sockets, doomed), await token_socket(sockets, doomed)
    other = await token_socket(sockets, bystander)
    assert (await subscribe(watching, doomed, bystander))["presences"] == {
        str(doomed_id): online(),
        str(bystander.pk): online(),
    }
    views = {socket: RoomView(await join(socket)) for socket in (watching, first, other)}
    assert (await api.aroom_presence(ROOM, friend))["count"] == 3
    assert await api.aonline_count() == 3
    before = await live_facts(friend, bystander)
    await asyncio.to_thread(signals.wait_sent)
    offline_signals.clear()  # the three coming online
    # The room's diffs of the joins, if any are still on their way.
    for socket, view in views.items():
        while not await socket.receive_nothing(timeout=0.2):
            view.apply(await receive(socket))
    # (on a busy machine the joins' diffs may come later than that silence: waited for)
    assert await views[watching].until(watching, {friend, doomed, bystander}, 3) == []

    await sync_to_async(doomed.delete)()
    # Erased before delete() returned: neither online nor counted (failed before: 3).
    assert await api.aonline_count() == 2
    # Both sockets close with 4401 (one in the room, one not).
    await assert_closed_with(first, 4401)
    await assert_closed_with(second, 4401)
    # The watcher is shown them offline, and both room views lose them: not listed, not
    # counted (the room's frames may come as one diff or two: the cascade's privacy change
    # unlists them, their socket's leave uncounts them).
    diffs = await views[watching].until(watching, {friend, bystander}, 2)
    if not diffs:  # the room's frames came first (the socket's leave announces the room too)
        diffs = [await receive(watching)]
    assert diffs == [{"type": "presence_diff", "presences": {str(doomed_id): HIDDEN}}]
    assert await views[other].until(other, {friend, bystander}, 2) == []
    assert (await api.aroom_presence(ROOM, friend))["count"] == 2
    assert await sent_offline(offline_signals) == [doomed_id]  # once
    # Out of the room at once, without the grace: room_left once, at the deletion.
    left = [each for each in await sent(room_signals) if each[1] == doomed_id]
    assert left == [("entered", doomed_id, ROOM, at(0)), ("left", doomed_id, ROOM, at(0))]

    # Nothing of them is left to sweep (their sockets' own closes came after the erase, and
    # the room's leave removed them), so nothing is sent again after the grace.
    store = get_store()
    assert await store.arun(store.plans.describe_connections(doomed_id)) == []
    states = await store.arun(store.plans.read([doomed_id]))
    assert states is not None and states.get(doomed_id, LiveState()) == LiveState()
    clock.shift(6)
    assert doomed_id not in (await lifecycle.asweep()).offline
    assert await asweep_rooms() == {}
    assert await sent_offline(offline_signals) == [doomed_id]
    assert [each for each in await sent(room_signals) if each[1] == doomed_id] == left
    assert await api.aonline_count() == 2
    assert (await api.aroom_presence(ROOM, friend))["count"] == 2
    # Nobody else's state changed.
    assert await live_facts(friend, bystander) == before
    await assert_silent(watching, other)


async def test_a_user_online_by_page_views_goes_too_and_a_rolled_back_delete_keeps_them(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    offline_signals: list[Any],
) -> None:
    doomed, friend = await new_user(make_user), await new_user(make_user)
    doomed_id = doomed.pk
    await public(doomed)
    await api.atouch(doomed)  # a page view, no socket
    watching = await sockets.open(friend)
    assert (await subscribe(watching, doomed))["presences"] == {str(doomed_id): online()}
    assert await api.aonline_count() == 2

    @sync_to_async
    def delete_then_roll_back() -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            doomed.delete()
            raise RuntimeError("rolled back")

    await delete_then_roll_back()  # erases nothing: the erase waits for the commit
    assert await api.aonline_count() == 2
    await assert_silent(watching)
    came_online = {("online", doomed_id), ("online", friend.pk)}
    assert set(await sent_offline(offline_signals)) == came_online  # and no user_offline
    offline_signals.clear()

    # Django cleared the instance's pk, though the delete was rolled back: read it again.
    doomed = await sync_to_async(get_user_model().objects.get)(pk=doomed_id)
    await sync_to_async(doomed.delete)()
    assert await api.aonline_count() == 1
    assert await receive(watching) == {
        "type": "presence_diff",
        "presences": {str(doomed_id): HIDDEN},
    }
    assert await sent_offline(offline_signals) == [doomed_id]
    clock.shift(301)  # past the online window: the sweep finds nothing of them
    assert doomed_id not in (await lifecycle.asweep()).offline
    assert [uid for uid in await sent_offline(offline_signals) if uid == doomed_id] == [doomed_id]


async def test_a_renewal_under_way_does_not_undo_the_at_once_leave(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cascade's privacy change has the deleted user's socket renew its rooms with the new
    flags (recheck_rooms) while the socket closes: a renewal written after the at-once leave
    joined the room again (a stay that ended is renewed as a join), the user counted until the
    connection's expiry. Here the renewal's write is held until the leave is written, or for
    half a second at most: the leave waits for it (failed before: the count stayed 3)."""
    doomed, friend, bystander = [await new_user(make_user) for _ in range(3)]
    doomed_id = doomed.pk
    await public(doomed, bystander)
    await sync_to_async(Contact.objects.create)(owner=friend, contact=bystander)
    watching = await token_socket(sockets, friend)
    first, other = await token_socket(sockets, doomed), await token_socket(sockets, bystander)
    views = {socket: RoomView(await join(socket)) for socket in (watching, first, other)}
    for socket, view in views.items():
        while not await socket.receive_nothing(timeout=0.2):
            view.apply(await receive(socket))
    # (on a busy machine the joins' diffs may come later than that silence: waited for)
    assert await views[watching].until(watching, {friend, doomed, bystander}, 3) == []
    renewing, left = asyncio.Event(), asyncio.Event()
    renew, leave_rooms = live.arenew_rooms, live.ConnectionRooms.leave_rooms

    async def held_renewal(user: Any, *args: Any) -> None:
        if user.pk == doomed_id:
            renewing.set()
            with contextlib.suppress(TimeoutError):  # a Redis write slow to land
                await asyncio.wait_for(left.wait(), 0.5)
        await renew(user, *args)

    async def leave_while_renewing(self: live.ConnectionRooms, at_once: bool = False) -> None:
        if self.viewer_id == doomed_id:
            await asyncio.wait_for(renewing.wait(), TIMEOUT)
        await leave_rooms(self, at_once)
        if self.viewer_id == doomed_id:
            left.set()

    monkeypatch.setattr(live, "arenew_rooms", held_renewal)
    monkeypatch.setattr(live.ConnectionRooms, "leave_rooms", leave_while_renewing)
    await sync_to_async(doomed.delete)()
    await assert_closed_with(first, 4401)
    await asyncio.wait_for(left.wait(), TIMEOUT)
    await views[watching].until(watching, {friend, bystander}, 2)
    assert await views[other].until(other, {friend, bystander}, 2) == []
    assert (await api.aroom_presence(ROOM, friend))["count"] == 2
    assert await asweep_rooms() == {}
