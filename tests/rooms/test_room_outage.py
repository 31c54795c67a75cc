"""Rooms while presence's Redis is unreachable (a real Redis made unreachable: CACHES pointed at
a port nobody listens on, as tests/core/test_api.py and tests/live/test_hub.py do).

A join is told ``unavailable`` (not an empty room_state, which would say nobody is here), the
socket stays open and nothing else changes; ``GET rooms/<room>`` answers 503 ``unavailable``;
``api.room_presence`` never raises, as ``get_presence`` (the room reads empty). Once Redis
answers again, a join and a read work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import PermissionDenied
from django.test import Client, override_settings

from presence import announce, api
from presence.hub import Hub, room_refresh
from presence.models import PrivacySettings
from presence.store import Plan
from tests.live.sockets import (
    BASE,
    TIMEOUT,
    Sockets,
    assert_silent,
    heartbeat,
    new_user,
    receive,
)
from tests.live.sockets import sockets as sockets
from tests.privacy_cases import quiet_login
from tests.rooms.members import enter
from tests.rooms.rules import ROOMS
from tests.rooms.test_sockets import held_cards
from tools.redis_server import free_port

ROOM = "post:1"
#: presence tries an unreachable Redis again after RETRY_INTERVAL (the 503's Retry-After)
SETTINGS = {**BASE, "ROOMS": ROOMS, "OFFLINE_GRACE": 5, "CONNECTION_TTL": 90}


@pytest.fixture(autouse=True)
def _room_settings(settings: Any) -> None:
    settings.PRESENCE = dict(SETTINGS)


def unreachable_presence_redis(settings: Any) -> override_settings:
    """Presence's Redis (the cache's) on a port nobody listens on; the channel layer's stays."""
    caches = {alias: dict(conf) for alias, conf in settings.CACHES.items()}
    caches["default"]["LOCATION"] = f"redis://127.0.0.1:{free_port()}/0"
    return override_settings(CACHES=caches)


def quiet_outage(caplog: pytest.LogCaptureFixture) -> None:
    # The outage is logged once (a warning): expected here, not a failure of the test run.
    caplog.set_level(logging.ERROR, logger="presence")


# --- the WebSocket ------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
@pytest.mark.pubsub_layer
async def test_a_join_during_an_outage_is_told_unavailable_and_a_later_join_works(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    alice = await new_user(make_user)
    socket = await sockets.open(alice)
    with unreachable_presence_redis(settings):
        await socket.send_json_to({"type": "join", "room": ROOM, "meta": {"mode": "reading"}})
        told = await receive(socket)
        # An error naming the room, not a room_state showing it empty.
        assert told["type"] == "error" and told["code"] == "unavailable", told
        assert told["room"] == ROOM and ROOM in told["message"]
        # The socket stays open and answers what does not need the room.
        await heartbeat(socket)
        await socket.send_json_to({"type": "leave", "room": ROOM})  # never joined: a no-op
        await assert_silent(socket)
    # Redis answers again: the same join works, on the same socket.
    await socket.send_json_to({"type": "join", "room": ROOM, "meta": {"mode": "reading"}})
    state = await receive(socket)
    assert state["type"] == "room_state" and state["room"] == ROOM, state
    assert set(state["members"]) == {str(alice.pk)}
    assert state["members"][str(alice.pk)]["meta"] == {"mode": "reading"}
    assert (state["others"], state["count"]) == (0, 1)
    await assert_silent(socket)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_a_failed_join_leaves_the_connections_other_rooms_as_they_were(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    alice, bob = await new_user(make_user), await new_user(make_user)
    await sync_to_async(PrivacySettings.objects.create)(user=alice, online_visibility="everyone")
    socket = await sockets.open(alice)
    await socket.send_json_to({"type": "join", "room": "post:2", "meta": {"mode": "editing"}})
    assert (await receive(socket))["type"] == "room_state"
    with unreachable_presence_redis(settings):
        await socket.send_json_to({"type": "join", "room": ROOM, "meta": None})
        assert (await receive(socket))["code"] == "unavailable"
    # Redis answers again: alice is in post:2 (with her meta), and in nothing else.
    for room, listed in (("post:2", {str(alice.pk)}), (ROOM, set())):
        seen = await sync_to_async(api.room_presence)(room, bob)
        assert set(seen["members"]) == listed, (room, seen)
    seen = await sync_to_async(api.room_presence)("post:2", bob)
    assert seen["members"][str(alice.pk)]["meta"] == {"mode": "editing"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_a_join_again_failing_during_a_refresh_leaves_the_view_delivered_to(
    sockets: Sockets,
    make_user: Callable[..., Any],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A join again while a refresh reads the view reads the room anew; when that read fails,
    the view is delivered to again (bob's join reaches alice) and, the refresh's read being
    discarded, it is refreshed at the next sweep."""
    quiet_outage(caplog)
    alice, bob = await new_user(make_user), await new_user(make_user)
    await sync_to_async(PrivacySettings.objects.create)(user=bob, online_visibility="everyone")
    a = await sockets.open(alice)
    await a.send_json_to({"type": "join", "room": ROOM, "meta": None})
    assert (await receive(a))["type"] == "room_state"
    hub = Hub.current()
    assert hub is not None
    reached, let_go = held_cards(monkeypatch, room_refresh)
    announce.note_layer_failure()  # announcements may have been lost: every view refreshed
    refreshing = asyncio.ensure_future(hub.rooms.sweep())
    await asyncio.wait_for(reached.wait(), TIMEOUT)  # the refresh's read is done
    with unreachable_presence_redis(settings):
        await a.send_json_to({"type": "join", "room": ROOM, "meta": {"mode": "back"}})
        assert (await receive(a))["code"] == "unavailable"
    let_go.set()
    await asyncio.wait_for(refreshing, TIMEOUT)
    await assert_silent(a)  # the refresh's read is older than the join again's: not sent
    b = await sockets.open(bob)
    await b.send_json_to({"type": "join", "room": ROOM, "meta": None})
    assert (await receive(b))["type"] == "room_state"
    told = await receive(a)
    assert told["type"] == "room_diff" and str(bob.pk) in told["joins"], told
    # The next sweep sends the view a fresh room_state (what it showed may be stale).
    await hub.rooms.sweep()
    fresh = await receive(a)
    assert fresh["type"] == "room_state" and fresh["count"] == 2, fresh


# --- HTTP and the Python API --------------------------------------------------------------------


@pytest.mark.django_db
def test_the_counts_endpoint_answers_503_not_empty_rooms_during_an_outage(
    make_user: Callable[..., Any], settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    quiet_outage(caplog)
    alice = make_user()
    enter(alice, ROOM)
    client = Client()
    quiet_login(client, alice)
    url = f"/presence/api/room_counts?room={ROOM}"
    with unreachable_presence_redis(settings):
        response = client.get(url)
        assert response.status_code == 503, response.content
        assert response["Retry-After"] == "2"
        assert response.json()["error"]["code"] == "unavailable"
        assert client.get("/presence/api/room_counts?room=Bad").status_code == 400
    assert client.get(url).json() == {"counts": {ROOM: 1}}


@pytest.mark.django_db
def test_the_endpoint_answers_503_unavailable_during_an_outage(
    make_user: Callable[..., Any], settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    quiet_outage(caplog)
    alice = make_user()
    enter(alice, ROOM)
    client = Client()
    quiet_login(client, alice)
    url = f"/presence/api/rooms/{ROOM}"
    with unreachable_presence_redis(settings):
        response = client.get(url)
        assert response.status_code == 503, response.content
        assert response["Content-Type"] == "application/json"
        assert response["Retry-After"] == "2"  # RETRY_INTERVAL (2 s by default), rounded up
        body = response.json()
        assert set(body) == {"error"} and body["error"]["code"] == "unavailable"
        assert body["error"]["message"]
        # Bad input is still answered as such.
        assert client.get("/presence/api/rooms/nope:1").status_code == 404
        assert client.get("/presence/api/rooms/Bad").status_code == 400
    response = client.get(url)
    assert response.status_code == 200
    assert set(response.json()["members"]) == {str(alice.pk)}


@pytest.mark.django_db
def test_room_presence_reads_the_room_empty_during_an_outage_as_get_presence_reads_offline(
    make_user: Callable[..., Any], settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    quiet_outage(caplog)
    alice, bob = make_user(), make_user()
    PrivacySettings.objects.create(user=alice, online_visibility="everyone")
    enter(alice, ROOM)
    assert api.room_presence(ROOM, bob)["count"] == 1
    with unreachable_presence_redis(settings):
        # Never raises for the outage (a page renders), as get_presence shows alice offline.
        assert api.room_presence(ROOM, bob) == {
            "room": ROOM,
            "members": {},
            "others": 0,
            "count": 0,
            "next": None,
        }
        assert api.get_presence(alice, bob).status == "offline"
        # What does not need Redis is refused as ever.
        with pytest.raises(PermissionDenied):
            api.room_presence(ROOM, None)
    assert set(api.room_presence(ROOM, bob)["members"]) == {str(alice.pk)}


@pytest.mark.django_db
def test_room_counts_read_every_room_empty_during_an_outage_as_room_presence_does(
    make_user: Callable[..., Any], settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    quiet_outage(caplog)
    alice, bob = make_user(), make_user()
    enter(alice, ROOM)
    assert api.room_counts([ROOM, "post:2"], bob) == {ROOM: 1, "post:2": 0}
    with unreachable_presence_redis(settings):
        assert api.room_counts([ROOM, "post:2"], bob) == {ROOM: 0, "post:2": 0}
        assert api.room_presence(ROOM, bob)["count"] == 0
        with pytest.raises(PermissionDenied):  # what does not need Redis is refused as ever
            api.room_counts([ROOM], None)
    assert api.room_counts([ROOM], bob) == {ROOM: 1}


# --- the members' live state unread (Redis too slow for that read) ------------------------------


class LiveStateUnread:
    """The candidates' live state read as when its reply comes too late (``_late``: the plan's
    fallback, None), while ``on``; the rest of Redis answers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from presence.store.plans.reads import ReadPlans

        self.on = True
        real = ReadPlans.read_recent

        def read_recent(plans: Any, user_ids: Any, since: float) -> Any:
            plan = real(plans, user_ids, since)
            if not self.on:
                return plan
            return Plan(commands=plan.commands, parse=lambda replies: None, fallback=None)

        monkeypatch.setattr(ReadPlans, "read_recent", read_recent)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_a_join_whose_members_live_state_is_unread_is_told_unavailable(
    sockets: Sockets, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a room_state listing nobody: its members would read offline and be left out."""
    alice, bob = await new_user(make_user), await new_user(make_user)
    await sync_to_async(PrivacySettings.objects.create)(user=bob, online_visibility="everyone")
    await sync_to_async(enter)(bob, ROOM)
    socket = await sockets.open(alice)
    unread = LiveStateUnread(monkeypatch)
    await socket.send_json_to({"type": "join", "room": ROOM, "meta": None})
    told = await receive(socket)
    assert told["type"] == "error" and told["code"] == "unavailable", told
    assert told["room"] == ROOM
    unread.on = False
    await socket.send_json_to({"type": "join", "room": ROOM, "meta": None})
    state = await receive(socket)
    assert state["type"] == "room_state" and set(state["members"]) == {str(alice.pk), str(bob.pk)}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_a_refresh_redis_cannot_read_in_full_keeps_the_view_and_comes_again(
    sockets: Sockets, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a layer failure each view gets a fresh room_state; one whose members' live state
    cannot be read keeps what it shows (not a room of offline members), and is refreshed at
    the next sweep."""
    alice, bob = await new_user(make_user), await new_user(make_user)
    await sync_to_async(PrivacySettings.objects.create)(user=bob, online_visibility="everyone")
    await sync_to_async(enter)(bob, ROOM)
    socket = await sockets.open(alice)
    await socket.send_json_to({"type": "join", "room": ROOM, "meta": None})
    assert set((await receive(socket))["members"]) == {str(alice.pk), str(bob.pk)}
    hub = Hub.current()
    assert hub is not None
    unread = LiveStateUnread(monkeypatch)
    announce.note_layer_failure()
    await hub.rooms.sweep()
    await assert_silent(socket)
    unread.on = False
    await hub.rooms.sweep()
    fresh = await receive(socket)
    assert fresh["type"] == "room_state" and set(fresh["members"]) == {str(alice.pk), str(bob.pk)}
    await hub.rooms.sweep()  # once
    await assert_silent(socket)
