"""The WebSocket consumer at ws/presence/, end to end: WebsocketCommunicator against the real
channels_redis layer and a real Redis (no mocks, no in-memory layer).

Time that matters to presence (time.time) is controlled with the ``clock`` fixture or
time_machine; the event loop's clock is real and only paces the coalescing window, so waiting
for a frame (``receive_json_from(timeout=...)``) and asserting silence for a short while
(``receive_nothing``) are the only real waits.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
import time_machine
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.apps import apps
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.test import Client, override_settings

from presence import api, consumers, lifecycle
from presence.announce import group_name
from presence.conf import get_settings
from presence.hub import Hub
from presence.models import Block, Contact, LastSeen, PrivacySettings, UserStatus
from presence.routing import websocket_urlpatterns
from presence.store import get_store
from tests.clock import at
from tests.conftest import close_pubsub_layer, on_one_redis, on_the_core_layer
from tests.ids import missing_id, redis_member, wire_id
from tests.privacy_cases import (
    CASES,
    CUSTOM,
    LEVELS,
    NOW,
    Case,
    build,
    expected,
    quiet_login,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
]

APP = URLRouter(websocket_urlpatterns)
UNKNOWN_ID = wire_id(missing_id())
#: the settings every test here starts from: a short coalescing window keeps tests quick, the
#: hub's own sweep stays out of the way (tests call lifecycle.asweep() after moving the clock),
#: and a busy test machine is not taken for a Redis outage
BASE = {"COALESCE_WINDOW": 0.05, "SWEEP_INTERVAL": 3600, "SOCKET_TIMEOUT": 5}
#: long enough for a diff to arrive if one was going to (window 0.05 s + a few queries)
QUIET = 0.2
TIMEOUT = 3

IPHONE = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148"
ELECTRON = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/124.0 Electron/30.0.1"
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0"


# --- frames and presences ---------------------------------------------------------------------


def presence(
    status: str = "offline",
    last_seen: str | None = None,
    devices: tuple[str, ...] | list[str] = (),
    text: str | None = None,
    emoji: str | None = None,
    activity: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A PRESENCE object as the protocol sends it (``invisible`` only in one's own)."""
    return {
        "status": status,
        "last_seen": last_seen,
        "devices": list(devices),
        "text": text,
        "emoji": emoji,
        "activity": activity,
        **extra,
    }


HIDDEN = presence()


def iso(seconds: float = 0) -> str:
    """The ISO 8601 time ``seconds`` after the clock fixture's start."""
    return at(seconds).isoformat()


def online(seconds: float = 0, devices: tuple[str, ...] = ("web",), **fields: Any) -> dict:
    return presence("online", iso(seconds), devices, **fields)


def state(presences: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    return {"type": "presence_state", "presences": {str(k): v for k, v in presences.items()}}


def diff(presences: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    return {"type": "presence_diff", "presences": {str(k): v for k, v in presences.items()}}


def error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, **extra}


def status_reply(own: dict[str, Any]) -> dict[str, Any]:
    return {"type": "status", "presence": own}


def presence_settings(**overrides: Any) -> override_settings:
    return override_settings(PRESENCE={**BASE, **overrides})


# --- connections ------------------------------------------------------------------------------


class Sockets:
    """Opens communicators and closes every one of them at the end of the test."""

    def __init__(self) -> None:
        self.opened: list[WebsocketCommunicator] = []

    def make(
        self,
        user: Any,
        query: str = "",
        headers: list[tuple[bytes, bytes]] | None = None,
        app: Any = APP,
    ) -> WebsocketCommunicator:
        communicator = WebsocketCommunicator(app, "/ws/presence/" + query, headers=headers)
        if user is not ...:
            communicator.scope["user"] = user
        self.opened.append(communicator)
        return communicator

    async def open(
        self,
        user: Any,
        query: str = "",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> WebsocketCommunicator:
        """An accepted connection whose opening heartbeat has been recorded."""
        communicator = self.make(user, query, headers)
        connected, _ = await communicator.connect(timeout=TIMEOUT)
        assert connected
        # The accept goes out before the opening heartbeat is written; frames are handled in
        # order after the connect handler, so an answered (empty) subscribe means it was.
        assert await subscribe(communicator) == state({})
        return communicator

    async def close(self, communicator: WebsocketCommunicator) -> None:
        self.opened.remove(communicator)
        await communicator.disconnect(timeout=TIMEOUT)

    async def rejected(self, communicator: WebsocketCommunicator) -> None:
        """A refused handshake has no connection to close: end the application task."""
        self.opened.remove(communicator)
        await communicator.wait(timeout=0.1)

    async def close_all(self) -> bool:
        """Close what is open; True if every consumer was still running (a clean test)."""
        clean = True
        for communicator in self.opened:
            if communicator.future.done():
                clean = clean and not communicator.future.cancelled()
                continue
            await communicator.disconnect(timeout=TIMEOUT)
        self.opened.clear()
        return clean


async def open_sockets() -> AsyncIterator[Sockets]:
    """The body of the ``sockets`` fixture (tests/test_live.py has one too)."""
    opened = Sockets()
    yield opened
    clean = await opened.close_all()
    hub = Hub.current()
    if hub is not None:
        if clean:
            # Every connection left the hub, which stopped its tasks and left its groups.
            assert hub.connections == set()
            assert hub.watchers == {}
            assert hub.watched == {}  # nor any connection's list of them
            assert hub._tasks == []
        elif hub._tasks:
            await hub._stop()  # a consumer was cancelled by a failing assertion
        # The sweeps a stopped hub goes on with (for CONNECTION_TTL + OFFLINE_GRACE) end here.
        if hub._lingering is not None:
            hub._lingering.cancel()
    await close_pubsub_layer()
    # Nothing of the hub may outlive it (a channel-layer receive may take up to its BZPOPMIN
    # timeout, 5 s, to end after a cancellation it swallowed).
    lingering = asyncio.all_tasks() - {asyncio.current_task()}
    if lingering:
        _, lingering = await asyncio.wait(lingering, timeout=6)
    assert lingering == set()
    await get_store().aclose()


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    # After the database fixtures: closing connections writes LastSeen before the flush.
    async for opened in open_sockets():
        yield opened


@pytest.fixture(autouse=True)
def _base_settings(settings: Any) -> None:
    settings.PRESENCE = dict(BASE)


async def new_user(make_user: Callable[..., Any], **fields: Any) -> Any:
    return await sync_to_async(make_user)(**fields)


@sync_to_async
def lets_see(target: Any, *viewers: Any, close_friend: bool = False) -> None:
    """``target`` adds the viewers to its contacts (contacts visibility lets them see it)."""
    for viewer in viewers:
        Contact.objects.create(owner=target, contact=viewer, close_friend=close_friend)


async def subscribe(communicator: WebsocketCommunicator, *users: Any) -> dict[str, Any]:
    ids = [u if isinstance(u, int | str) else wire_id(u) for u in users]
    await communicator.send_json_to({"type": "subscribe", "users": ids})
    return await communicator.receive_json_from(timeout=TIMEOUT)


async def send_frame(communicator: WebsocketCommunicator, text: str) -> None:
    # send_to() refuses an empty string; the ASGI event carries any text.
    await communicator.send_input({"type": "websocket.receive", "text": text})


async def receive(communicator: WebsocketCommunicator) -> dict[str, Any]:
    return await communicator.receive_json_from(timeout=TIMEOUT)


async def assert_silent(*communicators: WebsocketCommunicator, seconds: float = QUIET) -> None:
    for communicator in communicators:
        assert await communicator.receive_nothing(timeout=seconds), await receive(communicator)
        seconds = 0.01  # the others had the same time already


async def eventually(check: Callable[[], Any], timeout: float = TIMEOUT) -> bool:
    """Whether ``check()`` (maybe a coroutine) holds within ``timeout``: for work a consumer
    does after its last frame out, which no later frame can confirm."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return True
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)


async def set_status(communicator: WebsocketCommunicator, **fields: Any) -> dict[str, Any]:
    await communicator.send_json_to({"type": "set_status", **fields})
    return await receive(communicator)


async def heartbeat(communicator: WebsocketCommunicator, state_: str = "active") -> None:
    await communicator.send_json_to({"type": "heartbeat", "state": state_})
    # Frames are handled in order: an answered (empty) subscribe means the beat was recorded.
    assert await subscribe(communicator) == state({})


@sync_to_async
def last_seen_row(user: Any) -> datetime | None:
    row = LastSeen.objects.filter(user=user).first()
    return row.seen_at if row else None


# --- connecting -------------------------------------------------------------------------------


async def test_anonymous_connection_is_closed_with_4401(sockets: Sockets) -> None:
    for user in (AnonymousUser(), ...):  # ... : no "user" in the scope at all
        communicator = sockets.make(user)
        connected, _ = await communicator.connect(timeout=TIMEOUT)
        assert connected  # accepted first, so that browsers see the code
        assert await communicator.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4401,
        }
        # Whatever it sends now is ignored.
        await communicator.send_json_to({"type": "subscribe", "users": [1]})
        assert await communicator.receive_nothing(timeout=0.1)
    assert Hub.current() is None  # an anonymous connection never reaches the hub


def _session_cookie(user: Any) -> bytes:
    """A real session in the session store (logged in without recording activity)."""
    client = Client()
    quiet_login(client, user)
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}".encode()


def _asgi_headers(origin: bytes | None, cookie: bytes | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"host", b"testserver"), (b"user-agent", FIREFOX.encode())]
    if origin is not None:
        headers.append((b"origin", origin))
    if cookie is not None:
        headers.append((b"cookie", cookie))
    return headers


async def test_site_application_authenticates_by_session_and_checks_origin(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    from siteproject.asgi import application

    user = await new_user(make_user)
    cookie = await sync_to_async(_session_cookie)(user)
    origin = b"http://testserver"

    async def attempt(origin: bytes | None, cookie: bytes | None) -> WebsocketCommunicator:
        communicator = sockets.make(..., headers=_asgi_headers(origin, cookie), app=application)
        return communicator

    # No session cookie, or one of no session: anonymous, closed with 4401.
    for bad_cookie in (None, b"sessionid=not-a-session-key"):
        communicator = await attempt(origin, bad_cookie)
        assert await communicator.connect(timeout=TIMEOUT) == (True, None)
        assert await communicator.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4401,
        }

    # Another site's page (a foreign Origin, or null) is refused at the handshake even with a
    # valid session.
    for bad_origin in (b"http://evil.example", b"null"):
        communicator = await attempt(bad_origin, cookie)
        connected, _ = await communicator.connect(timeout=TIMEOUT)
        assert not connected
        await sockets.rejected(communicator)
    assert (await api.aget_presence(user, user)).as_dict() == presence(invisible=False)

    # A client sending no Origin is no browser, so no other site's page: it is served.
    communicator = await attempt(None, cookie)
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    assert await subscribe(communicator, user) == state({user.pk: online(invisible=False)})
    await sockets.close(communicator)

    # The real session: the user is online on the web from the first frame on.
    communicator = await attempt(origin, cookie)
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    assert await subscribe(communicator, user) == state({user.pk: online(invisible=False)})


# --- device kinds -----------------------------------------------------------------------------


DEVICE_CASES = [
    # (query, User-Agent, device kind recorded)
    ("?device=mobile", FIREFOX, "mobile"),
    ("?device=desktop", IPHONE, "desktop"),  # the client's word beats the guess
    ("?device=web", ELECTRON, "web"),
    ("", IPHONE, "mobile"),
    ("", ELECTRON, "desktop"),
    ("", FIREFOX, "web"),
    ("", None, "web"),
]


async def test_device_from_query_or_user_agent(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    for query, user_agent, device in DEVICE_CASES:
        user = await new_user(make_user)
        headers = [(b"user-agent", user_agent.encode())] if user_agent else []
        communicator = await sockets.open(user, query, headers)
        assert await subscribe(communicator, user) == state(
            {user.pk: online(devices=(device,), invisible=False)}
        ), (query, user_agent)


async def test_unknown_device_is_an_error_and_the_guess_is_used(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user = await new_user(make_user)
    communicator = sockets.make(user, "?device=toaster", [(b"user-agent", IPHONE.encode())])
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    assert await receive(communicator) == error(
        "invalid_value", "Unknown device 'toaster': use web, mobile or desktop; using mobile."
    )
    # The connection stays open and counts as the guessed device.
    assert await subscribe(communicator, user) == state(
        {user.pk: online(devices=("mobile",), invisible=False)}
    )


# --- snapshots --------------------------------------------------------------------------------


async def test_snapshot_is_sent_for_newly_subscribed_ids_only(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer = await new_user(make_user)
    on, off, custom, hidden = [await new_user(make_user) for _ in range(4)]
    await lets_see(on, viewer)
    await lets_see(off, viewer)
    await lets_see(custom, viewer)
    await sync_to_async(LastSeen.objects.record_many)({off.pk: at(-3600).timestamp()})
    await sync_to_async(UserStatus.objects.create)(user=custom, **CUSTOM)
    clock.shift(-10)
    await api.atouch(on, "mobile")  # online through a page request 10 s ago
    await api.atouch(hidden)  # online, but it does not let the viewer see it
    clock.shift(10)
    communicator = await sockets.open(viewer)

    assert await subscribe(communicator, on, off, custom, hidden, viewer) == state(
        {
            on.pk: online(-10, ("mobile",)),
            off.pk: presence("offline", iso(-3600)),
            custom.pk: presence(**CUSTOM),
            hidden.pk: HIDDEN,
            viewer.pk: online(invisible=False),  # oneself: the true presence
        }
    )
    # Subscribing again to what is subscribed sends an empty snapshot; new ids only otherwise.
    assert await subscribe(communicator, on) == state({})
    assert await subscribe(communicator, off, on, off) == state({})
    newcomer = await new_user(make_user)
    assert await subscribe(communicator, on, newcomer, custom) == state({newcomer.pk: HIDDEN})


async def test_unsubscribe_stops_diffs(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target, other = [await new_user(make_user) for _ in range(3)]
    await lets_see(target, viewer)
    await lets_see(other, viewer)
    communicator = await sockets.open(viewer)
    assert await subscribe(communicator, target, other) == state(
        {target.pk: HIDDEN, other.pk: HIDDEN}
    )
    # An unsubscribe is not answered; ids not subscribed (here of no user) are ignored.
    await communicator.send_json_to({"type": "unsubscribe", "users": [wire_id(target), UNKNOWN_ID]})
    assert await subscribe(communicator) == state({})  # answered: the unsubscribe was handled
    await sockets.open(target)
    await sockets.open(other)  # still subscribed: the proof that diffs were being delivered
    assert await receive(communicator) == diff({other.pk: online()})
    await assert_silent(communicator)
    # Subscribing again sends the current presence as a snapshot.
    assert await subscribe(communicator, target) == state({target.pk: online()})


def spellings(user: Any) -> list[int | str]:
    """Ways a client may name ``user``: with integer pks a JSON number or a string, with UUID
    pks the canonical text or its upper case."""
    if isinstance(user.pk, int):
        return [user.pk, str(user.pk)]
    return [str(user.pk), str(user.pk).upper()]


async def test_ids_are_answered_as_the_client_spelt_them(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, first, second = [await new_user(make_user) for _ in range(3)]
    await lets_see(first, viewer)
    await lets_see(second, viewer)
    watcher = await sockets.open(viewer)
    # One of each spelling in one frame (integers: a number and a string); naming a user twice
    # subscribes once, under the first spelling.
    one, two = spellings(first)[0], spellings(second)[1]
    nobody = str(missing_id())
    users = [one, two, spellings(first)[1], nobody]
    await watcher.send_json_to({"type": "subscribe", "users": users})
    assert await receive(watcher) == state({one: HIDDEN, two: HIDDEN})
    assert await receive(watcher) == error(
        "unknown_users",
        f"No user has the id(s) {nobody}; the others are subscribed.",
        users=[nobody],  # as sent: a string stays a string
    )
    # Diffs keep the spelling of the subscription.
    await sockets.open(first)
    assert await receive(watcher) == diff({one: online()})
    await sockets.open(second)
    assert await receive(watcher) == diff({two: online()})
    # Unsubscribing in another spelling is the same user; subscribing again takes the new one.
    await watcher.send_json_to({"type": "unsubscribe", "users": [spellings(second)[0]]})
    assert await subscribe(watcher, spellings(second)[0]) == state({spellings(second)[0]: online()})
    assert subscriptions() == {first.pk: 1, second.pk: 1}


async def test_ids_the_sites_pk_cannot_be_are_refused_and_change_nothing(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    watcher = await sockets.open(viewer)
    # A UUID site takes no number; an integer site no UUID.
    bad = 7 if not isinstance(target.pk, int) else "0b6f2c9e-3d4a-4f1e-9c2b-7a1d5e8f9a10"
    await watcher.send_json_to({"type": "subscribe", "users": [wire_id(target), bad]})
    assert await receive(watcher) == error("invalid_value", f"{bad!r} is not a user id.")
    assert subscriptions() == {}
    assert await subscribe(watcher) == state({})


# --- diffs on changes -------------------------------------------------------------------------


async def test_no_diff_for_a_heartbeat_that_changes_nothing(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
    tab = await sockets.open(target)
    assert await receive(watcher) == diff({target.pk: online()})

    for _ in range(3):
        clock.shift(20)
        await heartbeat(tab, "active")
    await assert_silent(watcher)
    # The heartbeats were recorded: last seen moved (visible in a fresh snapshot)...
    other = await sockets.open(viewer)
    assert await subscribe(other, target) == state({target.pk: online(60)})
    # ... and the next real change is the very next frame the watcher gets.
    await heartbeat(tab, "idle")
    assert await receive(watcher) == diff({target.pk: presence("idle", iso(60), ["web"])})
    await heartbeat(tab, "active")
    assert await receive(watcher) == diff({target.pk: online(60)})


async def test_diffs_for_dnd_invisible_and_custom_status(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    tab = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})
    # The target watches itself too: it sees its true presence and the "invisible" flag.
    assert await subscribe(tab, target) == state({target.pk: online(invisible=False)})

    own = online(invisible=False, text=None)
    dnd = {**own, "status": "dnd"}
    assert await set_status(tab, status="dnd") == status_reply(dnd)
    assert await receive(tab) == diff({target.pk: dnd})
    assert await receive(watcher) == diff({target.pk: presence("dnd", iso(0), ["web"])})

    invisible = {**own, "invisible": True}
    assert await set_status(tab, status="invisible") == status_reply(invisible)
    assert await receive(tab) == diff({target.pk: invisible})
    # To others invisible is exactly offline, with last seen hidden.
    assert await receive(watcher) == diff({target.pk: HIDDEN})

    custom = {"text": "In a meeting", "emoji": "📅", "activity": "Planning"}
    assert await set_status(tab, status="auto", **custom) == status_reply({**own, **custom})
    assert await receive(tab) == diff({target.pk: {**own, **custom}})
    assert await receive(watcher) == diff({target.pk: online(**custom)})

    assert await set_status(tab, status="auto", text="Lunch") == status_reply(
        {**own, "text": "Lunch"}
    )
    assert await receive(tab) == diff({target.pk: {**own, "text": "Lunch"}})
    assert await receive(watcher) == diff({target.pk: online(text="Lunch")})
    await assert_silent(watcher, tab)


async def test_custom_status_expires_by_itself(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    tab = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})
    reply = await set_status(tab, status="dnd", text="Focus", emoji="🎧", expires_in=60)
    assert reply == status_reply(presence("dnd", iso(0), ["web"], "Focus", "🎧", invisible=False))
    assert await receive(watcher) == diff(
        {target.pk: presence("dnd", iso(0), ["web"], "Focus", "🎧")}
    )

    clock.shift(59)
    report = await lifecycle.asweep()
    assert (report.offline, report.expired_statuses) == ([], 0)
    await assert_silent(watcher)

    clock.shift(2)
    report = await lifecycle.asweep()
    assert (report.offline, report.expired_statuses) == ([], 1)
    # The text and emoji clear; the dnd choice stays.
    assert await receive(watcher) == diff({target.pk: presence("dnd", iso(0), ["web"])})
    assert (await lifecycle.asweep()).expired_statuses == 0  # claimed once
    await assert_silent(watcher)


# --- several devices --------------------------------------------------------------------------


async def test_devices_aggregate_across_connections(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
    web = await sockets.open(target, "?device=web")
    assert await receive(watcher) == diff({target.pk: online()})
    clock.shift(1)
    phone = await sockets.open(target, "?device=mobile")
    both = ("web", "mobile")
    assert await receive(watcher) == diff({target.pk: online(1, both)})

    # One idle and one active device: online, and nothing to tell.
    await heartbeat(web, "idle")
    await assert_silent(watcher)
    # Both idle: idle.
    await heartbeat(phone, "idle")
    assert await receive(watcher) == diff({target.pk: presence("idle", iso(1), both)})
    # One active again: online.
    await heartbeat(web, "active")
    assert await receive(watcher) == diff({target.pk: online(1, both)})
    # An explicit dnd wins over every device's activity...
    assert await set_status(phone, status="dnd") == status_reply(
        presence("dnd", iso(1), both, invisible=False)
    )
    assert await receive(watcher) == diff({target.pk: presence("dnd", iso(1), both)})
    await heartbeat(web, "idle")
    await heartbeat(phone, "idle")
    await assert_silent(watcher)
    assert await set_status(web, status="auto") == status_reply(
        presence("idle", iso(1), both, invisible=False)
    )
    assert await receive(watcher) == diff({target.pk: presence("idle", iso(1), both)})


async def test_closing_one_of_two_tabs_keeps_the_user_online(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    first = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})
    second = await sockets.open(target)
    phone = await sockets.open(target, "?device=mobile")
    assert await receive(watcher) == diff({target.pk: online(devices=("web", "mobile"))})

    # A second web tab closing changes nothing anyone sees.
    clock.shift(5)
    await sockets.close(second)
    await assert_silent(watcher)
    # The last mobile connection closing takes "mobile" off the devices, and nothing else.
    await sockets.close(phone)
    assert await receive(watcher) == diff({target.pk: online()})
    assert await last_seen_row(target) is None  # a connection is still open
    # The closes made the user due at the end of the grace...
    clock.shift(get_settings().OFFLINE_GRACE + 1)
    report = await lifecycle.asweep()
    # ... but the open tab keeps them online: checked again when its heartbeat runs out.
    assert (report.offline, report.rescheduled) == ([], 1)
    await assert_silent(watcher)
    interval = get_settings().HEARTBEAT_INTERVAL
    clock.shift(interval - 11)  # the tab's next heartbeat, an interval after its first
    await heartbeat(first, "active")
    assert await subscribe(first, target) == state({target.pk: online(interval, invisible=False)})


# --- going offline: reload grace, last seen, crashed connections ------------------------------


async def test_reload_within_the_grace_does_not_flap(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    grace = get_settings().OFFLINE_GRACE
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    tab = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})

    clock.shift(10)
    await sockets.close(tab)  # a reload: the page goes...
    await assert_silent(watcher)
    clock.shift(grace - 1)
    tab = await sockets.open(target)  # ... and comes back within the grace
    await assert_silent(watcher)
    clock.shift(2)  # past the end of the first grace
    assert (await lifecycle.asweep()).offline == []
    await assert_silent(watcher)

    # Closed for good: still online during the grace, offline after it.
    closed_at = 10 + grace + 1
    await sockets.close(tab)
    clock.shift(grace)  # the grace counts from the end of the close's second: not yet
    assert (await lifecycle.asweep()).offline == []
    await assert_silent(watcher)
    clock.shift(1)
    assert (await lifecycle.asweep()).offline == [target.pk]
    assert await receive(watcher) == diff({target.pk: presence("offline", iso(closed_at))})
    # Last seen was persisted when the last connection ended.
    assert await last_seen_row(target) == at(closed_at)


async def test_last_seen_is_persisted_when_the_last_connection_ends(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user = await new_user(make_user)
    first = await sockets.open(user)
    second = await sockets.open(user, "?device=desktop")
    clock.shift(30)
    await sockets.close(first)
    assert await last_seen_row(user) is None
    clock.shift(30)
    await sockets.close(second)
    assert await last_seen_row(user) == at(60)


async def test_a_silent_connection_is_dropped_after_its_ttl(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    ttl = get_settings().CONNECTION_TTL
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    tab = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})

    # A heartbeat within the TTL keeps a connection alive past its first deadline.
    last_beat = ttl - 10
    clock.shift(last_beat)
    await heartbeat(tab)
    await heartbeat(watcher)
    clock.shift(20)
    assert (await lifecycle.asweep()).offline == []
    await assert_silent(watcher)

    # Then the target's connection goes silent (its process was killed: no close ever comes).
    clock.shift(ttl - 20 - 1)
    await heartbeat(watcher)
    assert (await lifecycle.asweep()).offline == []
    await assert_silent(watcher)
    clock.shift(2)
    assert (await lifecycle.asweep()).offline == [target.pk]
    assert await receive(watcher) == diff({target.pk: presence("offline", iso(last_beat))})
    # Last seen persisted at the last heartbeat; the dead connection is gone from Redis.
    assert await last_seen_row(target) == at(last_beat)
    assert await connections_in_redis(target) == []
    # A fresh snapshot agrees.
    assert await subscribe(await sockets.open(viewer), target) == state(
        {target.pk: presence("offline", iso(last_beat))}
    )


async def connections_in_redis(user: Any) -> list[str]:
    """The user's live connections as the store keeps them ("id:bit:idle:since:beat")."""
    store = get_store()
    return await store.arun(store.describe_connections(user.pk))


async def test_a_crash_swept_exactly_at_the_ttl_persists_last_seen(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    ttl = get_settings().CONNECTION_TTL
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})
    clock.shift(ttl)  # the TTL counts from the end of the heartbeat's second: not yet
    await heartbeat(watcher)
    assert (await lifecycle.asweep()).offline == []
    # The target's deadline: due now, and gone by domain.live_status's rule; the store drops
    # the connection at the same moment (sweeps run every second: this is the common case).
    clock.shift(1)
    assert (await lifecycle.asweep()).offline == [target.pk]
    assert await receive(watcher) == diff({target.pk: presence("offline", iso(0))})
    assert await connections_in_redis(target) == []
    assert await last_seen_row(target) == at(0)


async def test_changes_within_the_coalescing_window_make_one_diff(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    window = 0.5
    with presence_settings(COALESCE_WINDOW=window):
        viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, viewer)
        watcher = await sockets.open(viewer)
        assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
        loop = asyncio.get_running_loop()
        started = loop.time()
        tab = await sockets.open(target)  # online
        await set_status(tab, status="dnd")  # dnd
        await heartbeat(tab, "idle")  # still dnd
        await set_status(tab, status="auto", text="Away", emoji="🌙")  # idle, with a text
        assert loop.time() - started < window, "the changes took longer than the window"
        assert await receive(watcher) == diff(
            {target.pk: presence("idle", iso(0), ["web"], "Away", "🌙")}
        )
        assert loop.time() - started >= window
        await assert_silent(watcher, seconds=window + QUIET)


# --- bad input --------------------------------------------------------------------------------

LONG = "x" * 141
BAD_FRAMES = [
    # (frame text, error code, message)
    ("not json", "invalid_json", "The frame is not valid JSON."),
    ("", "invalid_json", "The frame is not valid JSON."),
    ('{"type": "subscribe", "users": [1]', "invalid_json", "The frame is not valid JSON."),
    ("[1, 2]", "invalid_message", "Expected a JSON object."),
    ("42", "invalid_message", "Expected a JSON object."),
    ('"subscribe"', "invalid_message", "Expected a JSON object."),
    ("null", "invalid_message", "Expected a JSON object."),
    ("{}", "invalid_message", "'type' is required and must be a string."),
    ('{"users": [1]}', "invalid_message", "'type' is required and must be a string."),
    ('{"type": 5}', "invalid_message", "'type' is required and must be a string."),
    (
        '{"type": "ping"}',
        "unknown_type",
        "Unknown message type 'ping': use one of heartbeat, subscribe, unsubscribe, set_status, "
        "watch_feed, unwatch_feed.",
    ),
    *[
        (
            json.dumps({"type": kind, **users}),
            "invalid_message",
            "'users' must be a list of user ids (numbers or strings).",
        )
        for kind in ("subscribe", "unsubscribe")
        for users in (
            {},
            {"users": None},
            {"users": 7},
            {"users": "1,2"},
            {"users": {"1": True}},
            {"users": [True]},
            {"users": [1.5]},
            {"users": [None]},
            {"users": [[1]]},
        )
    ],
    *[
        (
            json.dumps({"type": kind, "users": users}),
            "invalid_value",
            "User ids are positive integers.",
        )
        for kind in ("subscribe", "unsubscribe")
        for users in ([-3], [0], [1, -1])
    ],
    # Strings the site's pk cannot be (an integer or a UUID alike): refused before any lookup.
    *[
        (
            json.dumps({"type": kind, "users": users}),
            "invalid_value",
            f"{bad!r} is not a user id.",
        )
        for kind in ("subscribe", "unsubscribe")
        for users, bad in ((["abc"], "abc"), (["1e3"], "1e3"), (["-1"], "-1"), ([" 7"], " 7"))
    ],
    (
        '{"type": "heartbeat", "state": "asleep"}',
        "invalid_value",
        "Unknown state 'asleep': use 'active' or 'idle'.",
    ),
    ('{"type": "heartbeat", "state": 1}', "invalid_message", "'state' must be 'active' or 'idle'."),
    (
        '{"type": "set_status"}',
        "invalid_message",
        "'status' is required: one of 'auto', 'dnd', 'invisible'.",
    ),
    (
        '{"type": "set_status", "status": 1}',
        "invalid_message",
        "'status' is required: one of 'auto', 'dnd', 'invisible'.",
    ),
    (
        '{"type": "set_status", "status": "busy"}',
        "invalid_value",
        "Unknown status 'busy': use 'auto', 'dnd' or 'invisible'.",
    ),
    (
        '{"type": "set_status", "status": "offline"}',
        "invalid_value",
        "Unknown status 'offline': use 'auto', 'dnd' or 'invisible'.",
    ),
    *[
        (
            json.dumps({"type": "set_status", "status": "auto", field: value}),
            "invalid_value",
            f"'{field}' is {len(value)} characters long; at most {limit}.",
        )
        for field, value, limit in (
            ("text", LONG, 140),
            ("activity", LONG, 140),
            ("emoji", "🙂" * 17, 16),
        )
    ],
    (
        json.dumps({"type": "set_status", "status": "auto", "text": "a\u0007b"}),
        "invalid_value",
        "'text' must not contain control characters.",
    ),
    (
        '{"type": "set_status", "status": "auto", "text": 5}',
        "invalid_message",
        "'text' must be a string or null.",
    ),
    (
        '{"type": "set_status", "status": "dnd", "emoji": ["x"]}',
        "invalid_message",
        "'emoji' must be a string or null.",
    ),
    *[
        (
            json.dumps({"type": "set_status", "status": "dnd", "text": "x", "expires_in": v}),
            "invalid_value",
            "'expires_in' must be between 1 and 2592000 seconds.",
        )
        for v in (-5, 0, 0.5, 30 * 24 * 3600 + 1)
    ],
    *[
        (
            json.dumps({"type": "set_status", "status": "dnd", "text": "x", "expires_in": v}),
            "invalid_message",
            "'expires_in' must be a number of seconds or null.",
        )
        for v in ("60", True, [60])
    ],
]


#: a frame over MAX_FRAME_BYTES (65536) by one byte, valid JSON otherwise
OVERSIZE = json.dumps({"type": "heartbeat", "pad": ""})
OVERSIZE = OVERSIZE[:-2] + "x" * (65537 - len(OVERSIZE)) + OVERSIZE[-2:]
BAD_FRAMES += [
    (b'{"type": "heartbeat"}', "invalid_message", "Send JSON text frames, not binary ones."),
    (b"\x00\xff", "invalid_message", "Send JSON text frames, not binary ones."),
    (OVERSIZE, "frame_too_large", "The frame is 65537 bytes long; at most 65536."),
    (
        json.dumps({"type": "subscribe", "users": list(range(1, 1002))}),
        "too_many_subscriptions",
        "1001 user ids in one frame; at most 1000.",
    ),
]


@sync_to_async
def database_state(*users: Any) -> dict[str, Any]:
    ids = [u.pk for u in users]
    return {
        model.__name__: sorted(
            tuple(sorted(row.items())) for row in model.objects.filter(user__in=ids).values()
        )
        for model in (UserStatus, PrivacySettings, LastSeen)
    }


def redis_state(client: redis.Redis) -> dict[str, Any]:
    """Every presence key and its content (the channel layer's keys are left out)."""
    dump: dict[str, Any] = {}
    for key in sorted(client.scan_iter("presence:*")):
        kind = client.type(key)
        if kind == "zset":
            dump[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            dump[key] = client.hgetall(key)
        else:
            dump[key] = (kind, client.dump(key))
    return dump


def subscriptions() -> dict[int, int]:
    """User id -> number of this process's connections subscribed to it."""
    hub = Hub.current()
    assert hub is not None
    return {uid: len(watchers) for uid, watchers in hub.watchers.items()}


async def test_bad_frames_are_answered_with_errors_and_change_nothing(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
) -> None:
    with presence_settings(RATE_LIMIT=(1000, 10)):
        sender, friend, third = [await new_user(make_user) for _ in range(3)]
        await lets_see(sender, friend)
        await lets_see(friend, sender)
        await lets_see(third, sender)
        # The sender has a status of its own and a subscription; a friend watches it.
        tab = await sockets.open(sender)
        mine = presence("dnd", iso(0), ["web"], "Busy", "🔧", invisible=False)
        assert await set_status(tab, status="dnd", text="Busy", emoji="🔧") == status_reply(mine)
        watcher = await sockets.open(friend)
        assert await subscribe(tab, friend, sender) == state({friend.pk: online(), sender.pk: mine})
        assert await subscribe(watcher, sender) == state(
            {sender.pk: presence("dnd", iso(0), ["web"], "Busy", "🔧")}
        )
        redis_before = redis_state(redis_client)
        database_before = await database_state(sender, friend)
        subscribed_before = subscriptions()

        wrong = {}
        for frame, code, message in BAD_FRAMES:
            if isinstance(frame, bytes):
                await tab.send_to(bytes_data=frame)
            else:
                await send_frame(tab, frame)
            reply = await receive(tab)
            if reply != error(code, message):
                wrong[frame[:80]] = reply
            # The connection is still open and working (an empty subscribe is answered)...
            if (reply := await subscribe(tab)) != state({}):
                wrong[frame[:80]] = reply
            # ... and nothing changed: presence in Redis, choices in the database,
            # subscriptions.
            if redis_state(redis_client) != redis_before:
                wrong[frame[:80]] = "changed Redis"
            if await database_state(sender, friend) != database_before:
                wrong[frame[:80]] = "changed the database"
            if subscriptions() != subscribed_before:
                wrong[frame[:80]] = "changed subscriptions"
        assert wrong == {}
        # Nobody was told anything.
        await assert_silent(tab, watcher)
        assert await subscribe(tab, third) == state({third.pk: HIDDEN})
        # A real change still reaches both, as the very next frame.
        assert await set_status(tab, status="auto") == status_reply(online(invisible=False))
        assert await receive(tab) == diff({sender.pk: online(invisible=False)})
        assert await receive(watcher) == diff({sender.pk: online()})


async def test_unknown_user_ids_are_reported_and_the_others_subscribed(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    missing = [wire_id(missing_id(0)), wire_id(missing_id(1))]
    await watcher.send_json_to(
        {"type": "subscribe", "users": [missing[0], wire_id(target), missing[1]]}
    )
    assert await receive(watcher) == state({target.pk: HIDDEN})
    assert await receive(watcher) == error(
        "unknown_users",
        f"No user has the id(s) {missing[0]}, {missing[1]}; the others are subscribed.",
        users=missing,
    )
    assert subscriptions() == {target.pk: 1}
    await sockets.open(target)
    assert await receive(watcher) == diff({target.pk: online()})
    # Unknown ids are not remembered: asking again reports them again.
    await watcher.send_json_to({"type": "subscribe", "users": [missing[0]]})
    assert await receive(watcher) == state({})
    assert (await receive(watcher))["users"] == [missing[0]]


async def test_subscriptions_over_the_limit_are_refused_whole(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(MAX_SUBSCRIPTIONS=3):
        viewer = await new_user(make_user)
        one, two, three, four = [await new_user(make_user) for _ in range(4)]
        for user in (one, two, three, four):
            await lets_see(user, viewer)
        watcher = await sockets.open(viewer)
        assert await subscribe(watcher, one, two) == state({one.pk: HIDDEN, two.pk: HIDDEN})

        # Two more would make four: nothing of that frame is subscribed.
        assert await subscribe(watcher, three, four) == error(
            "too_many_subscriptions",
            "This would make 4 subscriptions; at most 3 per connection. "
            "Unsubscribe from some first.",
        )
        assert subscriptions() == {one.pk: 1, two.pk: 1}
        # Four in one frame are refused before anything else.
        assert await subscribe(watcher, one, two, three, four) == error(
            "too_many_subscriptions", "4 user ids in one frame; at most 3."
        )
        await sockets.open(three)
        await sockets.open(two)
        assert await receive(watcher) == diff({two.pk: online()})  # not three
        await assert_silent(watcher)

        # Ids already subscribed do not count twice; after an unsubscribe there is room.
        assert await subscribe(watcher, one, two, three) == state({three.pk: online()})
        await watcher.send_json_to({"type": "unsubscribe", "users": [wire_id(one)]})
        assert await subscribe(watcher, four) == state({four.pk: HIDDEN})
        assert subscriptions() == {two.pk: 1, three.pk: 1, four.pk: 1}


# --- rate limit -------------------------------------------------------------------------------


async def test_flooding_past_the_rate_limit_closes_with_4429(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(RATE_LIMIT=(5, 10)):
        viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, viewer)
        watcher = await sockets.open(viewer)  # frame 1 (open() subscribes to nothing)
        assert await subscribe(watcher, target) == state({target.pk: HIDDEN})  # 2
        await send_frame(watcher, "not json")  # 3: bad frames count too
        assert (await receive(watcher))["code"] == "invalid_json"
        assert await subscribe(watcher) == state({})  # 4
        await watcher.send_json_to({"type": "heartbeat"})  # 5
        await watcher.send_json_to({"type": "subscribe", "users": []})  # 6: one too many
        assert await watcher.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4429,
        }

        # The connection ends for presence right after the close (its only one: grace begins).
        async def gone() -> bool:
            return await connections_in_redis(viewer) == []

        assert await eventually(gone)
        assert subscriptions() == {}
        await sockets.open(target)
        assert await watcher.receive_nothing(timeout=QUIET)


async def test_rate_limit_is_a_sliding_window(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(RATE_LIMIT=(5, 10)):
        user = await new_user(make_user)
        communicator = sockets.make(user)
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        for _ in range(3):  # t=0: 3 frames
            assert await subscribe(communicator) == state({})
        clock.shift(5)
        for _ in range(2):  # t=5: 2 more, 5 in the last 10 s
            assert await subscribe(communicator) == state({})
        clock.shift(5)
        for _ in range(3):  # t=10: the 3 of t=0 have left the window
            assert await subscribe(communicator) == state({})
        await communicator.send_json_to({"type": "subscribe", "users": []})  # 6 within 10 s
        assert await communicator.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4429,
        }


async def test_a_heartbeat_keeps_the_devices_of_recent_page_requests(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
    await api.atouch(target, "mobile")  # a page request from the phone
    assert await receive(watcher) == diff({target.pk: online(devices=("mobile",))})
    clock.shift(1)
    tab = await sockets.open(target)  # the web app opens its socket a second later
    assert await receive(watcher) == diff({target.pk: online(1, ("web", "mobile"))})
    clock.shift(1)
    await heartbeat(tab)  # changes nothing
    await assert_silent(watcher)


# --- privacy: the snapshot, for every case of the matrix --------------------------------------


def expected_over_websocket(case: Case) -> dict[str, Any]:
    if case.relation != "self":
        return expected(case).as_json()
    # One's own connection makes one online on the web, whatever else the case says (an
    # online target's page requests, web and mobile, keep their devices).
    want = expected(replace(case, target_online=True))
    return replace(want, devices=("web", "mobile") if case.target_online else ("web",)).as_json()


def _variant_id(visibility: dict[str, str] | None) -> str:
    return Case(visibility, "self", False, True).id.split("-self-")[0]


async def test_privacy_matrix_through_the_snapshot(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    """Every case of tests/privacy_cases.py, each viewer on a socket of its own."""
    assert len(CASES) == 308
    with time_machine.travel(NOW, tick=False):
        scenarios = await build_all(CASES, make_user)
        seen = []
        for start in range(0, len(scenarios), 28):  # a few dozen sockets at a time
            chunk = scenarios[start : start + 28]
            seen += await asyncio.gather(*(_snapshot_of(sockets, s) for s in chunk))
            await sockets.close_all()
    wrong = {
        scenario.case.id: got
        for scenario, got in zip(scenarios, seen, strict=True)
        if got != _expected_frames(scenario.case, scenario.target)
    }
    assert wrong == {}


@sync_to_async
def build_all(cases: list[Case], make_user: Callable[..., Any]) -> list[Any]:
    # One transaction: one commit instead of one per row (on_commit announcements included).
    with transaction.atomic():
        return [build(case, make_user) for case in cases]


def _expected_frames(case: Case, target: Any) -> list[dict[str, Any]]:
    if case.relation == "anonymous":
        # Anonymous viewers get no socket at all (whatever the target allows).
        return [{"type": "websocket.close", "code": 4401}]
    return [
        state({target.pk: expected_over_websocket(case)}),
        error(
            "unknown_users",
            f"No user has the id(s) {UNKNOWN_ID}; the others are subscribed.",
            users=[UNKNOWN_ID],
        ),
    ]


async def _snapshot_of(sockets: Sockets, scenario: Any) -> list[dict[str, Any]]:
    """What the scenario's viewer receives subscribing to the target (and an unknown id)."""
    target = scenario.target
    if scenario.viewer is None:
        communicator = sockets.make(AnonymousUser())
        assert (await communicator.connect(timeout=TIMEOUT))[0]
        return [await communicator.receive_output(timeout=TIMEOUT)]
    communicator = await sockets.open(scenario.viewer)
    await communicator.send_json_to({"type": "subscribe", "users": [wire_id(target), UNKNOWN_ID]})
    return [await receive(communicator), await receive(communicator)]


# --- privacy: diffs ---------------------------------------------------------------------------

EVERYONE = dict.fromkeys(
    ("online_visibility", "last_seen_visibility", "activity_visibility"), "everyone"
)
DIFF_RELATIONS = ("contact", "close_friend", "stranger", "blocked_by_target", "blocking_target")


DIFF_VARIANTS = [
    (None, False),
    (EVERYONE, False),
    *[
        (EVERYONE | {field: level}, False)
        for field in ("online_visibility", "last_seen_visibility")
        for level in LEVELS[1:]
    ],
    (EVERYONE, True),
]


async def _watch(sockets: Sockets, scenario: Any) -> WebsocketCommunicator:
    communicator = await sockets.open(scenario.viewer)
    assert await subscribe(communicator, scenario.target) == state(
        {scenario.target.pk: expected(scenario.case).as_json()}
    ), scenario.case.id
    return communicator


async def test_privacy_of_diffs_when_targets_come_online(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    """In each variant a viewer of each relation subscribes to an offline target of its own,
    which then comes online: a viewer who may see a change receives exactly it, the others
    nothing at all."""
    cases = [
        Case(v, relation, inv, False) for v, inv in DIFF_VARIANTS for relation in DIFF_RELATIONS
    ]
    with time_machine.travel(NOW, tick=False):
        scenarios = await build_all(cases, make_user)
        watchers = await asyncio.gather(*(_watch(sockets, s) for s in scenarios))
        for scenario in scenarios:
            await api.atouch(scenario.target, "web")  # online, last seen now

        told: dict[tuple[str, bool], tuple[list[str], list[str]]] = {}
        wrong = {}
        for scenario, communicator in zip(scenarios, watchers, strict=True):
            case = scenario.case
            before = expected(case)
            after = expected(replace(case, target_online=True))
            if after.online:
                after = replace(after, devices=("web",))
            yes, no = told.setdefault((_variant_id(case.visibility), case.invisible), ([], []))
            if after != before:
                got = await receive(communicator)
                if got != diff({scenario.target.pk: after.as_json()}):
                    wrong[case.id] = got
                yes.append(case.relation)
            else:
                no.append(case.relation)
        await assert_silent(*watchers)
    assert wrong == {}
    # Who learns something, per variant, spelled out from the contract's rules.
    assert told == EXPECTED_TOLD


SEES_ALL = ["contact", "close_friend", "stranger"]
BLOCKS = ["blocked_by_target", "blocking_target"]
#: (variant, invisible) -> (relations told that the target came online, relations told nothing)
EXPECTED_TOLD = {
    ("defaults", False): (["contact", "close_friend"], ["stranger", *BLOCKS]),
    ("all=everyone", False): (SEES_ALL, BLOCKS),
    ("online=contacts", False): (["contact", "close_friend"], ["stranger", *BLOCKS]),
    ("online=close_friends", False): (["close_friend"], ["contact", "stranger", *BLOCKS]),
    ("online=nobody", False): ([], [*SEES_ALL, *BLOCKS]),
    # Whoever sees the status sees the change, whether or not last seen is shown.
    ("last_seen=contacts", False): (SEES_ALL, BLOCKS),
    ("last_seen=close_friends", False): (SEES_ALL, BLOCKS),
    ("last_seen=nobody", False): (SEES_ALL, BLOCKS),
    ("all=everyone", True): ([], [*SEES_ALL, *BLOCKS]),
}


# --- privacy: changes take effect on open connections at once ---------------------------------


@pytest.fixture
async def watched(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> dict[str, Any]:
    """A target online with a custom status, watched by a contact and by itself."""
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    await sync_to_async(UserStatus.objects.create)(user=target, text="Hi", emoji="👋")
    tab = await sockets.open(target)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: online(text="Hi", emoji="👋")})
    assert await subscribe(tab, target) == state(
        {target.pk: online(text="Hi", emoji="👋", invisible=False)}
    )
    return {"viewer": viewer, "target": target, "watcher": watcher, "tab": tab}


async def test_blocking_hides_at_once_and_unblocking_reveals(watched: dict[str, Any]) -> None:
    viewer, target, watcher, tab = (
        watched["viewer"],
        watched["target"],
        watched["watcher"],
        watched["tab"],
    )
    shown = diff({target.pk: online(text="Hi", emoji="👋")})
    for blocker, blocked in ((target, viewer), (viewer, target)):
        block = await sync_to_async(Block.objects.create)(blocker=blocker, blocked=blocked)
        assert await receive(watcher) == diff({target.pk: HIDDEN})
        await sync_to_async(block.delete)()
        assert await receive(watcher) == shown
    await assert_silent(tab)  # one's own view never depends on blocks


async def test_removing_the_viewer_from_contacts_hides_at_once(watched: dict[str, Any]) -> None:
    viewer, target, watcher = watched["viewer"], watched["target"], watched["watcher"]
    await sync_to_async(Contact.objects.filter(owner=target, contact=viewer).delete)()
    assert await receive(watcher) == diff({target.pk: HIDDEN})
    await lets_see(target, viewer)
    assert await receive(watcher) == diff({target.pk: online(text="Hi", emoji="👋")})
    # The viewer unfollowing the target changes nothing: the target's contacts decide.
    await sync_to_async(Contact.objects.create)(owner=viewer, contact=target)
    await sync_to_async(Contact.objects.filter(owner=viewer, contact=target).delete)()
    await assert_silent(watcher, watched["tab"])


async def test_the_contacts_api_reaches_open_sockets(watched: dict[str, Any]) -> None:
    """api.unfollow/follow/set_close_friend/block/unblock save rows as the admin does: open
    connections see each change at once (a site's own graph kept in sync through them)."""
    viewer, target, watcher = watched["viewer"], watched["target"], watched["watcher"]
    shown = diff({target.pk: online(text="Hi", emoji="👋")})
    assert await api.aunfollow(target, viewer) is True
    assert await receive(watcher) == diff({target.pk: HIDDEN})
    assert await api.afollow(target, viewer) is True
    assert await receive(watcher) == shown
    assert await api.ablock(viewer, target) is True
    assert await receive(watcher) == diff({target.pk: HIDDEN})
    assert await api.aunblock(viewer, target) is True
    assert await receive(watcher) == shown
    # Online to close friends only: the viewer sees it once marked, not after being unmarked
    # (the custom status stays visible to contacts).
    await sync_to_async(PrivacySettings.objects.create)(
        user=target, online_visibility="close_friends"
    )
    status_only = diff({target.pk: presence(text="Hi", emoji="👋")})
    assert await receive(watcher) == status_only
    assert await api.aset_close_friend(target, viewer) is True
    assert await receive(watcher) == shown
    assert await api.aset_close_friend(target, viewer, False) is True
    assert await receive(watcher) == status_only
    # Nothing to change: no signal, no diff.
    assert await api.aset_close_friend(target, viewer, False) is False
    assert await api.afollow(target, viewer) is False
    await assert_silent(watcher)


async def test_privacy_settings_take_effect_at_once(watched: dict[str, Any]) -> None:
    target, watcher = watched["target"], watched["watcher"]
    privacy = await sync_to_async(PrivacySettings.objects.create)(
        user=target, online_visibility="nobody"
    )
    # Offline with last seen hidden; the custom status follows its own setting (contacts).
    assert await receive(watcher) == diff({target.pk: presence(text="Hi", emoji="👋")})
    privacy.activity_visibility = "nobody"
    await sync_to_async(privacy.save)()
    assert await receive(watcher) == diff({target.pk: HIDDEN})
    privacy.online_visibility = privacy.activity_visibility = "contacts"
    await sync_to_async(privacy.save)()
    assert await receive(watcher) == diff({target.pk: online(text="Hi", emoji="👋")})
    await assert_silent(watcher, watched["tab"])


async def test_going_invisible_looks_offline_to_others_only(watched: dict[str, Any]) -> None:
    target, watcher, tab = watched["target"], watched["watcher"], watched["tab"]
    own = online(invisible=True)
    assert await set_status(tab, status="invisible") == status_reply(own)
    assert await receive(tab) == diff({target.pk: own})
    assert await receive(watcher) == diff({target.pk: HIDDEN})
    # Heartbeats of an invisible user tell nobody anything.
    await heartbeat(tab, "idle")
    assert await receive(tab) == diff({target.pk: {**own, "status": "idle"}})
    await assert_silent(watcher)
    assert await set_status(tab, status="auto") == status_reply(
        presence("idle", iso(0), ["web"], invisible=False)
    )
    assert await receive(tab) == diff(
        {target.pk: presence("idle", iso(0), ["web"], invisible=False)}
    )
    assert await receive(watcher) == diff({target.pk: presence("idle", iso(0), ["web"])})


# --- interest-based fan-out -------------------------------------------------------------------


@sync_to_async
def followers_of(target: Any, count: int) -> list[Any]:
    """``count`` users following ``target``, each among its contacts (allowed to see it)."""
    from django.contrib.auth import get_user_model

    model = get_user_model()
    model.objects.bulk_create([model(username=f"fan{target.pk}-{i}") for i in range(count)])
    fans = list(model.objects.filter(username__startswith=f"fan{target.pk}-").order_by("pk"))
    Contact.objects.bulk_create(
        [Contact(owner=target, contact=fan) for fan in fans]
        + [Contact(owner=fan, contact=target) for fan in fans]
    )
    return fans


@on_one_redis
@on_the_core_layer
async def test_a_change_reaches_subscribed_connections_only_through_one_group_member(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
) -> None:
    target = await new_user(make_user)
    fans = await followers_of(target, 200)
    subscribers = [await sockets.open(fan) for fan in fans[:3]]
    for communicator in subscribers:
        assert await subscribe(communicator, target) == state({target.pk: HIDDEN})
    # Followers connected but not subscribed to the target (another page) get nothing.
    others = [await sockets.open(fan) for fan in fans[3:5]]

    # One process, one member in the target's group: the hub's channel, not one per viewer.
    hub = Hub.current()
    assert hub is not None and hub.channel is not None
    layer = get_channel_layer()
    group = f"{layer.prefix}:group:{group_name(target.pk)}"
    assert redis_client.zrange(group, 0, -1) == [hub.channel]

    await sockets.open(target)
    for communicator in subscribers:
        assert await receive(communicator) == diff({target.pk: online()})
    await assert_silent(*subscribers, *others)
    assert redis_client.zrange(group, 0, -1) == [hub.channel]


# --- crash frames and failures inside handlers ------------------------------------------------

#: valid JSON nested past the parser's recursion limit: 1 KB of "[" once killed the consumer
DEEP = "[" * 1000 + "]" * 1000
SURROGATE = "\ud800"
#: frames the consumer must survive with an error frame (valid JSON, deep or with a lone
#: surrogate, escaped as JSON allows, in every string field of every frame type)
CRASH_FRAMES = [
    DEEP,
    "[" * 30_000 + "]" * 30_000,
    '{"type": "subscribe", "users": ' + DEEP + "}",
    '{"type": "heartbeat", "pad": ' + "{" * 1000 + "}" * 1000 + "}",
    *[
        json.dumps(frame)
        for frame in (
            {"type": SURROGATE},
            {SURROGATE: "x", "type": "ping"},
            {"type": "heartbeat", "state": SURROGATE},
            {"type": "subscribe", "users": [SURROGATE]},
            {"type": "unsubscribe", "users": [SURROGATE]},
            {"type": "set_status", "status": SURROGATE},
            {"type": "set_status", "status": "auto", "text": SURROGATE},
            {"type": "set_status", "status": "dnd", "text": "a" + SURROGATE + "b"},
            {"type": "set_status", "status": "auto", "emoji": SURROGATE},
            {"type": "set_status", "status": "auto", "activity": SURROGATE},
            {"type": "set_status", "status": "auto", "text": "x", "expires_in": SURROGATE},
            {"type": "watch_feed", "feed": SURROGATE},
            {"type": "unwatch_feed", "feed": SURROGATE},
        )
    ],
]


async def test_deep_json_and_lone_surrogates_are_answered_and_change_nothing(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
) -> None:
    with presence_settings(RATE_LIMIT=(1000, 10)):
        sender, friend = await new_user(make_user), await new_user(make_user)
        await lets_see(sender, friend)
        await lets_see(friend, sender)
        tab = await sockets.open(sender)
        mine = presence("dnd", iso(0), ["web"], "Busy", invisible=False)
        assert await set_status(tab, status="dnd", text="Busy") == status_reply(mine)
        watcher = await sockets.open(friend)
        assert await subscribe(tab, friend) == state({friend.pk: online()})
        assert await subscribe(watcher, sender) == state(
            {sender.pk: presence("dnd", iso(0), ["web"], "Busy")}
        )
        redis_before = redis_state(redis_client)
        database_before = await database_state(sender, friend)
        subscribed_before = subscriptions()

        wrong = {}
        for frame in CRASH_FRAMES:
            await send_frame(tab, frame)
            reply = await receive(tab)
            if reply.get("type") != "error" or not reply.get("message"):
                wrong[frame[:80]] = reply
            if (reply := await subscribe(tab)) != state({}):
                wrong[frame[:80]] = reply
            if redis_state(redis_client) != redis_before:
                wrong[frame[:80]] = "changed Redis"
            if await database_state(sender, friend) != database_before:
                wrong[frame[:80]] = "changed the database"
            if subscriptions() != subscribed_before:
                wrong[frame[:80]] = "changed subscriptions"
        assert wrong == {}
        await assert_silent(tab, watcher)
        # Deep JSON gets its own clear answer.
        await send_frame(tab, DEEP)
        assert await receive(tab) == error(
            "invalid_message", "The frame nests arrays or objects too deeply."
        )
        # Still working both ways.
        assert await set_status(tab, status="auto") == status_reply(online(invisible=False))
        assert await receive(watcher) == diff({sender.pk: online()})


async def test_a_failure_inside_a_handler_answers_internal_error_and_leaves_no_watch(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    viewer, target, other = [await new_user(make_user) for _ in range(3)]
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, other) == state({other.pk: HIDDEN})

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug below the consumer")

    # The failure comes after the hub watched the new ids.
    monkeypatch.setattr(lifecycle, "asnapshot", broken)
    with caplog.at_level("ERROR", logger="presence"):
        assert await subscribe(watcher, target) == error(
            "internal_error", "The server failed to handle this frame; try again later."
        )
    assert "handling a frame of user" in caplog.text and "RuntimeError" in caplog.text
    # Open, and nothing of the failed subscribe is watched.
    assert subscriptions() == {other.pk: 1}
    monkeypatch.undo()
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
    await sockets.open(target)
    assert await receive(watcher) == diff({target.pk: online()})


async def test_a_client_gone_while_its_frame_is_answered_is_no_failure(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The tab closes while its set_status is handled: the server refuses the reply (daphne
    # raises autobahn's Disconnected, "Attempt to send on a closed protocol"). Nothing is
    # logged as a failure, no error frame is attempted, and the status change itself is stored.
    # (Other refusals are failures: tests/test_sending.py.)
    from autobahn.exception import Disconnected

    user = await new_user(make_user)
    refusing = False

    async def app_refusing_sends(scope: Any, receive: Any, send: Any) -> None:
        async def server_send(message: dict[str, Any]) -> None:
            if refusing and message["type"] == "websocket.send":
                raise Disconnected("Attempt to send on a closed protocol")
            await send(message)

        await APP(scope, receive, server_send)

    tab = sockets.make(user, app=app_refusing_sends)
    assert (await tab.connect(timeout=TIMEOUT))[0]
    assert await subscribe(tab) == state({})
    refusing = True
    with caplog.at_level("DEBUG", logger="presence"):
        await tab.send_json_to({"type": "set_status", "status": "dnd"})
        assert await eventually(lambda: "left while a frame was answered" in caplog.text)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert await sync_to_async(lambda: UserStatus.objects.get(user=user).dnd)() is True
    # The socket is still served once the server sends again.
    refusing = False
    assert await subscribe(tab) == state({})


async def test_a_consumer_ended_without_disconnect_leaves_the_hub_and_redis(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    keeper = await sockets.open(target)  # keeps the hub running
    communicator = await sockets.open(viewer)
    assert await subscribe(communicator, target) == state({target.pk: HIDDEN})
    await communicator.send_json_to({"type": "watch_feed", "feed": "following"})
    assert await subscribe(communicator) == state({})
    hub = Hub.current()
    assert hub is not None and len(hub.connections) == 2 and hub.topic_members("feed")
    assert await connections_in_redis(viewer) != []

    # The server cancels the application (as daphne does at shutdown or after a close
    # timeout): no websocket.disconnect is ever handled.
    communicator.future.cancel()

    async def gone() -> bool:
        return await connections_in_redis(viewer) == []

    assert await eventually(gone)
    assert len(hub.connections) == 1
    assert hub.watchers == {}
    assert hub.watched == {}  # nor any connection's list of them
    assert hub.topics == {}
    # The other connection is unaffected.
    assert await subscribe(keeper, target) == state({target.pk: online(invisible=False)})


# --- subscribe cost ---------------------------------------------------------------------------


@on_one_redis
@on_the_core_layer
async def test_a_subscribe_of_unknown_ids_joins_no_channel_layer_group(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
    redis_commands: Any,
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    watcher = await sockets.open(viewer)
    unknown = [wire_id(missing_id(i)) for i in range(1000)]
    group_keys = f"{get_channel_layer().prefix}:group:*"
    before = redis_commands.snapshot()
    await watcher.send_json_to({"type": "subscribe", "users": unknown})
    assert await receive(watcher) == state({})
    assert (await receive(watcher))["users"] == unknown
    used = redis_commands.delta(before)
    # Nothing joined or left for them (group_add is a ZADD and an EXPIRE, group_discard a ZREM
    # per id), and hardly any Redis work at all.
    assert not {"zadd", "zrem", "expire"} & set(used), used
    assert sum(used.values()) <= 5, used
    assert list(redis_client.scan_iter(group_keys)) == []
    assert subscriptions() == {}
    # A known id among them still joins its group.
    await watcher.send_json_to({"type": "subscribe", "users": [UNKNOWN_ID, wire_id(target)]})
    assert await receive(watcher) == state({target.pk: HIDDEN})
    assert (await receive(watcher))["users"] == [UNKNOWN_ID]
    assert [key.rsplit(":", 1)[1] for key in redis_client.scan_iter(group_keys)] == [
        group_name(target.pk)
    ]


async def test_large_subscribes_count_as_several_frames_of_the_rate_limit(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    from presence.consumers import IDS_PER_FRAME

    many = [wire_id(missing_id(i)) for i in range(2 * IDS_PER_FRAME + 1)]  # three frames' worth
    with presence_settings(RATE_LIMIT=(5, 10)):
        user = await new_user(make_user)
        communicator = await sockets.open(user)  # 1
        await communicator.send_json_to({"type": "subscribe", "users": many})  # 2, 3, 4
        assert await receive(communicator) == state({})
        assert (await receive(communicator))["code"] == "unknown_users"
        await communicator.send_json_to({"type": "unsubscribe", "users": many})  # 5, 6, 7
        assert await communicator.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4429,
        }

        # A frame weighing more than the whole budget passes alone in its window.
        clock.shift(10)
        other = await sockets.open(await new_user(make_user))  # 1 of its own window
        clock.shift(10)
        heavy = [wire_id(missing_id(i)) for i in range(5 * IDS_PER_FRAME)]  # five frames' worth
        await other.send_json_to({"type": "subscribe", "users": heavy})
        assert await receive(other) == state({})
        assert (await receive(other))["code"] == "unknown_users"
        await other.send_json_to({"type": "heartbeat"})  # the budget is spent
        assert await other.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4429,
        }


# --- origin -----------------------------------------------------------------------------------


async def test_the_consumer_refuses_foreign_origins_by_itself_with_4403(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # APP has no origin validator in front, as on a site that forgot it.
    user = await new_user(make_user)
    for origin in (b"http://evil.example", b"https://testserver.evil.example", b"null"):
        communicator = sockets.make(user, headers=[(b"origin", origin)])
        assert await communicator.connect(timeout=TIMEOUT) == (True, None)
        assert await communicator.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4403,
        }, origin
    assert await connections_in_redis(user) == []
    # A page of the site itself (ALLOWED_HOSTS), and a client sending no Origin (not a
    # browser, so no other site's page), are served.
    for headers in (
        [(b"origin", b"http://testserver")],
        [(b"origin", b"http://localhost:8000")],
        [],
    ):
        communicator = await sockets.open(user, headers=headers)
        assert await subscribe(communicator, user) == state({user.pk: online(invisible=False)})


# --- sessions: logout and password changes close their sockets --------------------------------


def _logged_in_client(user: Any) -> Client:
    client = Client()
    quiet_login(client, user)
    return client


def _cookie_of(client: Client) -> bytes:
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}".encode()


async def _site_socket(sockets: Sockets, client: Client) -> WebsocketCommunicator:
    """A socket through the demo's ASGI application, authenticated by the client's session."""
    from siteproject.asgi import application

    cookie = await sync_to_async(_cookie_of)(client)
    communicator = sockets.make(
        ..., headers=_asgi_headers(b"http://testserver", cookie), app=application
    )
    assert await communicator.connect(timeout=TIMEOUT) == (True, None)
    assert await subscribe(communicator) == state({})
    return communicator


async def assert_closed_with(communicator: WebsocketCommunicator, code: int) -> None:
    assert await communicator.receive_output(timeout=TIMEOUT) == {
        "type": "websocket.close",
        "code": code,
    }


async def test_logout_closes_that_sessions_sockets_with_4401_only(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    caplog: pytest.LogCaptureFixture,
) -> None:
    user, viewer = await new_user(make_user), await new_user(make_user)
    await lets_see(user, viewer)
    laptop, phone = [await sync_to_async(_logged_in_client)(user) for _ in range(2)]
    laptop_key = laptop.session.session_key
    tabs = [await _site_socket(sockets, laptop) for _ in range(2)]
    other_session = await _site_socket(sockets, phone)
    watcher = await sockets.open(viewer)
    assert await subscribe(tabs[0], user) == state({user.pk: online(invisible=False)})
    assert await subscribe(watcher, user) == state({user.pk: online()})

    with caplog.at_level("DEBUG"):
        response = await sync_to_async(laptop.post)("/logout/")
    assert response.status_code == 302
    for tab in tabs:
        await assert_closed_with(tab, 4401)
    assert laptop_key not in caplog.text  # never logged

    # The other session's socket is open, receives and keeps the user online.
    assert await subscribe(other_session, user) == state({user.pk: online(invisible=False)})
    await assert_silent(watcher)
    hub = Hub.current()
    assert hub is not None and len(hub.accounts[user.pk]) == 1
    await sockets.close(other_session)
    assert user.pk not in hub.accounts


async def test_a_password_change_closes_the_sockets_of_the_other_sessions(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    from django.contrib.auth import update_session_auth_hash
    from django.http import HttpRequest

    user = await new_user(make_user)
    changing, other = [await sync_to_async(_logged_in_client)(user) for _ in range(2)]
    other_socket = await _site_socket(sockets, other)
    changing_socket = await _site_socket(sockets, changing)

    @sync_to_async
    def change_password() -> None:
        # As django.contrib.auth's PasswordChangeView does.
        request = HttpRequest()
        request.session = changing.session
        request.user = user
        user.set_password("a new secret")
        user.save()
        update_session_auth_hash(request, user)
        request.session.save()
        changing.cookies[settings.SESSION_COOKIE_NAME] = request.session.session_key

    await change_password()
    await assert_closed_with(other_socket, 4401)
    # The changing session's socket was opened with the session's old key (Django cycles it):
    # it closes too, and the browser reconnects with its renewed session.
    await assert_closed_with(changing_socket, 4401)
    renewed = await _site_socket(sockets, changing)
    assert await subscribe(renewed, user) == state({user.pk: online(invisible=False)})
    # The other session is no session any more: anonymous.
    from siteproject.asgi import application

    cookie = await sync_to_async(_cookie_of)(other)
    refused = sockets.make(
        ..., headers=_asgi_headers(b"http://testserver", cookie), app=application
    )
    assert await refused.connect(timeout=TIMEOUT) == (True, None)
    await assert_closed_with(refused, 4401)


async def test_frames_share_one_database_tidy_per_interval(
    sockets: Sockets, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Channels would close old database connections before every frame, in the thread all
    # database calls share; the consumer does it at most once per TIDY_INTERVAL per process.
    tidied = []
    real = consumers.tidy.close_old_connections

    def counting(**kwargs: Any) -> None:
        tidied.append(1)
        real(**kwargs)

    monkeypatch.setattr(consumers.tidy, "close_old_connections", counting)
    loop = asyncio.get_running_loop()
    started = loop.time()
    communicator = await sockets.open(await new_user(make_user))
    for _ in range(10):
        await heartbeat(communicator)  # two frames each: the beat and an empty subscribe
    intervals = (loop.time() - started) // consumers.TIDY_INTERVAL + 1
    assert 1 <= len(tidied) <= intervals
    monkeypatch.setattr(consumers.tidy, "TIDY_INTERVAL", 0.0)
    before = len(tidied)
    for _ in range(5):
        await heartbeat(communicator)
    assert len(tidied) - before == 10


async def test_a_session_ended_out_of_band_closes_its_socket_at_the_session_check_pace(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(HEARTBEAT_INTERVAL=10, SESSION_CHECK_INTERVAL=40):
        user = await new_user(make_user)
        client = await sync_to_async(_logged_in_client)(user)
        communicator = await _site_socket(sockets, client)
        # The session is deleted without a logout (an admin, "log out everywhere", ...).
        await sync_to_async(client.session.delete)()
        # Checked on a heartbeat, at the earliest half an interval after opening: still open.
        clock.shift(10)
        await heartbeat(communicator)
        # At the latest one interval after opening.
        clock.shift(30)
        await communicator.send_json_to({"type": "heartbeat", "state": "active"})
        await assert_closed_with(communicator, 4401)

    async def gone() -> bool:
        return await connections_in_redis(user) == []

    assert await eventually(gone)


async def test_sockets_opened_together_check_their_sessions_at_different_moments(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A thousand sockets opened by a deploy would otherwise query the sessions all at once,
    # every interval, in the one database thread the live updates wait for.
    draws = iter([0.0, 0.9])
    monkeypatch.setattr(consumers.consumer, "_draw", lambda: next(draws))
    with presence_settings(HEARTBEAT_INTERVAL=10, SESSION_CHECK_INTERVAL=40):
        first, second = await new_user(make_user), await new_user(make_user)
        clients = [await sync_to_async(_logged_in_client)(user) for user in (first, second)]
        late = await _site_socket(sockets, clients[0])  # checks a whole interval on
        early = await _site_socket(sockets, clients[1])  # checks 0.55 of an interval on
        for client in clients:
            await sync_to_async(client.session.delete)()
        clock.shift(25)
        await heartbeat(late)
        await early.send_json_to({"type": "heartbeat", "state": "active"})
        await assert_closed_with(early, 4401)
        clock.shift(15)
        await late.send_json_to({"type": "heartbeat", "state": "active"})
        await assert_closed_with(late, 4401)


# --- connections per user (MAX_CONNECTIONS_PER_USER) ------------------------------------------


async def redis_trace(user: Any) -> dict[str, Any]:
    """Everything Redis holds about a user's presence: their seen score, the fields and members
    of their connections in the bucket, their due time."""
    store = get_store()
    client = store.async_client
    bucket = store.bucket_of(user.pk)
    fields = await client.hgetall(store.conns_key(bucket))
    members = await client.zrange(store.expiries_key(bucket), 0, -1)
    member = redis_member(user)
    mine = f"{member}:"
    return {
        "seen": await client.zscore(store.seen_key(bucket), member),
        "fields": {k: v for k, v in fields.items() if k == member or k.startswith(mine)},
        "members": [m for m in members if m.startswith(mine)],
        "due": await client.zscore(store.user_due_key(user.pk), member),
    }


async def refused(communicator: WebsocketCommunicator) -> bool:
    """Whether the connection was accepted and then closed with 4429 before any frame."""
    connected, _ = await communicator.connect(timeout=TIMEOUT)
    assert connected  # accepted first, so that browsers see the close code
    return await communicator.receive_output(timeout=TIMEOUT) == {
        "type": "websocket.close",
        "code": 4429,
    }


async def test_a_connection_past_the_limit_is_closed_with_4429_and_leaves_no_trace(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(MAX_CONNECTIONS_PER_USER=3):
        viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, viewer)
        watcher = await sockets.open(viewer)
        assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
        tabs = [await sockets.open(target)]
        assert await receive(watcher) == diff({target.pk: online()})
        clock.shift(10)
        tabs += [await sockets.open(target), await sockets.open(target)]
        assert len(await connections_in_redis(target)) == 3
        before = await redis_trace(target)

        clock.shift(5)
        assert await refused(sockets.make(target, "?device=mobile"))
        # Nothing recorded: no connection, no device, no newer activity, no due time moved...
        assert await redis_trace(target) == before
        # ... and nothing announced.
        await assert_silent(watcher)
        # The open ones are untouched and keep working.
        await heartbeat(tabs[0], "idle")
        assert len(await connections_in_redis(target)) == 3

        # Once one closes, there is room again.
        await sockets.close(tabs[1])
        phone = await sockets.open(target, "?device=mobile")
        assert await receive(watcher) == diff({target.pk: online(15, devices=("web", "mobile"))})
        assert len(await connections_in_redis(target)) == 3
        await heartbeat(phone)


async def test_connections_of_other_processes_count_and_only_live_ones(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    ttl = get_settings().CONNECTION_TTL
    with presence_settings(MAX_CONNECTIONS_PER_USER=2):
        user = await new_user(make_user)
        store = get_store()
        # Two connections recorded by another process (the store is all processes share).
        for connection_id in ("other1", "other2"):
            opened = await store.arun(
                store.connection(user.pk, "open", at(0).timestamp(), connection_id)
            )
            assert opened is not None and not opened.refused
        assert await refused(sockets.make(user))
        clock.shift(ttl)
        assert await refused(sockets.make(user))
        # The other process crashed: its connections are gone a full CONNECTION_TTL after
        # their heartbeat's second, and count no more (even before a sweep drops them).
        clock.shift(1)
        await sockets.open(user)
        assert len(await connections_in_redis(user)) == 1


async def test_heartbeats_that_change_nothing_are_written_at_most_every_half_interval(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    interval = get_settings().HEARTBEAT_INTERVAL
    user = await new_user(make_user)
    tab = await sockets.open(user)

    async def last_written() -> int:
        (entry,) = await connections_in_redis(user)
        return int(entry.split(":")[4]) - int(at(0).timestamp())

    async def seen() -> float | None:
        store = get_store()
        key = store.seen_key(store.bucket_of(user.pk))
        return await store.async_client.zscore(key, redis_member(user))

    before = await seen()
    clock.shift(interval / 2 - 1)
    await heartbeat(tab)  # a client beating too often: nothing to write
    assert await last_written() == 0
    assert await seen() == before
    await heartbeat(tab, "idle")  # a change is written at once
    assert await last_written() == interval / 2 - 1
    assert (await api.aget_presence(user, user)).status == "idle"
    clock.shift(interval / 2 - 1)
    await heartbeat(tab, "idle")
    assert await last_written() == interval / 2 - 1
    clock.shift(1)  # half an interval since the last write
    await heartbeat(tab, "idle")
    assert await last_written() == interval - 1
    # The skipped beats never made the connection look dead: due when its last write expires.
    store = get_store()
    assert await store.async_client.zscore(store.user_due_key(user.pk), redis_member(user)) == (
        at(interval - 1).timestamp() + 1 + get_settings().CONNECTION_TTL
    )


async def test_a_sites_own_graph_kept_in_sync_by_the_recipe_reaches_open_sockets(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    """tests.graphsite's Follow model with the receivers of docs/api.md: following there is
    following in presence, and an open socket sees it at once."""
    if not apps.is_installed("tests.graphsite"):
        pytest.skip("tests.graphsite is not installed in this settings variant")
    from tests.graphsite.models import Follow

    viewer, target = await new_user(make_user), await new_user(make_user)
    await sockets.open(target)
    watcher = await sockets.open(viewer)
    assert await subscribe(watcher, target) == state({target.pk: HIDDEN})
    follow = await sync_to_async(Follow.objects.create)(follower=target, followed=viewer)
    assert await sync_to_async(Contact.objects.filter(owner=target, contact=viewer).exists)()
    assert await receive(watcher) == diff({target.pk: online()})
    await sync_to_async(follow.delete)()
    assert await receive(watcher) == diff({target.pk: HIDDEN})


async def test_one_time_format_on_every_path(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    """last_seen from the database keeps microseconds, from Redis whole seconds: the JSON
    endpoint, the WebSocket and the feed's created_at all say it one way (domain.iso_time)."""
    from django.test import AsyncClient

    from presence.feed import api as feed

    viewer, target = await new_user(make_user), await new_user(make_user)
    await sync_to_async(PrivacySettings.objects.create)(
        user=target, online_visibility="everyone", last_seen_visibility="everyone"
    )
    seen = datetime(2030, 1, 7, 9, 30, 0, 123456, tzinfo=UTC)
    await sync_to_async(LastSeen.objects.create)(user=target, seen_at=seen)
    watcher = await sockets.open(viewer)
    over_socket = (await subscribe(watcher, target))["presences"][str(target.pk)]["last_seen"]
    client = AsyncClient()
    await sync_to_async(client.force_login)(viewer)
    over_http = (await client.get(f"/presence/api/presence?users={target.pk}")).json()
    assert over_socket == over_http["presences"][str(target.pk)]["last_seen"]
    assert over_socket == "2030-01-07T09:30:00+00:00"
    activity = await sync_to_async(feed.post)(target, "Hello")
    created = (await sync_to_async(feed.activity_as_dict)(activity))["created_at"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", created)
