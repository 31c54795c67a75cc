"""PRESENCE["DEFAULT_PRIVACY"] over the WebSocket: the snapshot and the diffs of a user without a
PrivacySettings row follow the site's default levels, as the other read paths do
(tests/core/test_default_privacy.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from presence import api
from presence.hub import Hub
from presence.models import Block, PrivacySettings
from presence.routing import websocket_urlpatterns
from presence.store import get_store
from tests.clock import at
from tests.conftest import close_pubsub_layer
from tests.ids import wire_id

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
]

APP = URLRouter(websocket_urlpatterns)
TIMEOUT = 10  # bounds waits for what must come; generous for a busy machine
#: quick coalescing, no sweep of the hub's own in the way, a patient Redis on a busy machine
BASE = {"COALESCE_WINDOW": 0.05, "SWEEP_INTERVAL": 3600, "SOCKET_TIMEOUT": 5}
PUBLIC = dict.fromkeys(
    ("online_visibility", "last_seen_visibility", "activity_visibility"), "everyone"
)


@pytest.fixture
async def opened(transactional_db: Any) -> AsyncIterator[list[WebsocketCommunicator]]:
    """The communicators a test opens, closed at its end with the hub's tasks."""
    communicators: list[WebsocketCommunicator] = []
    yield communicators
    for communicator in communicators:
        if not communicator.future.done():
            await communicator.disconnect(timeout=TIMEOUT)
    hub = Hub.current()
    if hub is not None:
        if hub.tasks.running:
            await hub._stop()
        if hub.tasks.lingering is not None:
            hub.tasks.lingering.cancel()
    await close_pubsub_layer()
    lingering = asyncio.all_tasks() - {asyncio.current_task()}
    if lingering:
        await asyncio.wait(lingering, timeout=15)
    await get_store().aclose()


async def _connect(opened: list[WebsocketCommunicator], user: Any) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(APP, "/ws/presence/")
    communicator.scope["user"] = user
    opened.append(communicator)
    connected, _ = await communicator.connect(timeout=TIMEOUT)
    assert connected
    return communicator


async def _subscribe(communicator: WebsocketCommunicator, *users: Any) -> dict[str, Any]:
    await communicator.send_json_to({"type": "subscribe", "users": [wire_id(u) for u in users]})
    return await communicator.receive_json_from(timeout=TIMEOUT)


def _online(seconds: float = 0, **fields: Any) -> dict[str, Any]:
    return {
        "status": "online",
        "last_seen": at(seconds).isoformat(),
        "last_seen_approx": None,
        "devices": ["web"],
        "text": None,
        "emoji": None,
        "activity": None,
        **fields,
    }


HIDDEN = {
    "status": "offline",
    "last_seen": None,
    "last_seen_approx": None,
    "devices": [],
    "text": None,
    "emoji": None,
    "activity": None,
}
#: hidden, not blocked: all but the day shows (APPROXIMATE_LAST_SEEN)


async def test_the_snapshot_and_diffs_follow_the_site_default(
    settings: Any, clock: Any, opened: list[WebsocketCommunicator], make_user: Callable[..., Any]
) -> None:
    settings.PRESENCE = {**BASE, "DEFAULT_PRIVACY": PUBLIC}
    stranger, no_row, contacts_row, blocker = [await sync_to_async(make_user)() for _ in range(4)]
    await PrivacySettings.objects.acreate(
        user=contacts_row, online_visibility="contacts", last_seen_visibility="contacts"
    )
    await Block.objects.acreate(blocker=blocker, blocked=stranger)
    for user in (no_row, contacts_row, blocker):
        await api.atouch(user)
    viewer = await _connect(opened, stranger)
    snapshot = await _subscribe(viewer, no_row, contacts_row, blocker)
    assert snapshot == {
        "type": "presence_state",
        "presences": {
            str(no_row.pk): _online(),
            str(contacts_row.pk): HIDDEN,  # not even the day: seen today only
            str(blocker.pk): HIDDEN,
        },
    }
    # A change of a user without a row reaches the stranger (the live fan-out's facts).
    await api.aset_status(no_row, "dnd", text="Heads down")
    diff = await viewer.receive_json_from(timeout=TIMEOUT)
    assert diff == {
        "type": "presence_diff",
        "presences": {str(no_row.pk): _online(status="dnd", text="Heads down")},
    }
    # ... and invisibility still wins over the default.
    await api.aset_status(no_row, "invisible")
    diff = await viewer.receive_json_from(timeout=TIMEOUT)
    assert diff == {"type": "presence_diff", "presences": {str(no_row.pk): HIDDEN}}
    assert await viewer.receive_nothing(timeout=0.2)
