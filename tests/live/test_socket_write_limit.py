"""HTTP_RATE_LIMIT over the WebSocket: a ``set_status`` frame (and what it records) counts against
the same per-user budget as the HTTP writes, across sockets and reconnects; past it the frame is
answered ``rate_limited`` with ``retry_after`` and nothing is written."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from presence import api
from presence.feed.models import Activity
from presence.models import UserStatus
from tests.ids import wire_id
from tests.live.sockets import (
    BASE,
    Sockets,
    new_user,
    open_sockets,
    presence_settings,
    receive,
    set_status,
)

pytestmark = [pytest.mark.uuid_site]


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    async for opened in open_sockets():
        yield opened


LIMITED = {**BASE, "HTTP_RATE_LIMIT": (3, 60)}  # the clock fixture starts on a whole minute


def refused(retry_after: int) -> dict[str, Any]:
    return {
        "type": "error",
        "code": "rate_limited",
        "message": f"Too many changes in a short time; try again in {retry_after} seconds.",
        "retry_after": retry_after,
        "answers": "set_status",
    }


async def text_of(user: Any) -> str | None:
    own = await api.aget_presence(user, user)
    return own.text


async def test_status_frames_share_one_budget_across_sockets_and_reconnects(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(**LIMITED):
        user, other = await new_user(make_user), await new_user(make_user)
        first, second = await sockets.open(user), await sockets.open(user)
        for n, socket in enumerate((first, second, first)):
            reply = await set_status(socket, status="auto", text=f"status {n}")
            assert reply["type"] == "status", reply
            assert reply["presence"]["text"] == f"status {n}"
        clock.shift(20)
        assert await set_status(second, status="auto", text="one too many") == refused(40)
        await sockets.close(second)
        again = await sockets.open(user)  # a reconnect brings no fresh budget
        assert await set_status(again, status="auto", text="still too many") == refused(40)
        assert await text_of(user) == "status 2"  # nothing refused was written
        # The socket stays open and serves what writes nothing; others are not limited.
        await again.send_json_to({"type": "subscribe", "users": [wire_id(user)]})
        assert (await receive(again))["type"] == "presence_state"
        # Unsubscribed again: its own diff of "later" would race the status answer below.
        await again.send_json_to({"type": "unsubscribe", "users": [wire_id(user)]})
        others = await sockets.open(other)
        assert (await set_status(others, status="auto", text="mine"))["type"] == "status"
        clock.shift(40)  # the next window
        assert (await set_status(again, status="auto", text="later"))["type"] == "status"
        assert await text_of(user) == "later"


async def test_http_writes_and_status_frames_count_against_each_other(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    with presence_settings(**LIMITED):
        user = await new_user(make_user)

        @sync_to_async
        def http_writes(count: int) -> list[int]:
            client = Client()
            client.force_login(user)
            body = json.dumps({"status": "auto", "text": "over http"})
            return [
                client.post(
                    "/presence/api/status", body, content_type="application/json"
                ).status_code
                for _ in range(count)
            ]

        assert await http_writes(2) == [200, 200]
        socket: WebsocketCommunicator = await sockets.open(user)
        assert (await set_status(socket, status="dnd"))["type"] == "status"
        assert await set_status(socket, status="auto") == refused(60)
        assert await http_writes(1) == [429]
        status = await sync_to_async(UserStatus.objects.get)(user=user)
        assert status.dnd is True


async def test_a_refused_status_frame_records_no_activity(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates, settings: Any
) -> None:
    settings.PRESENCE_FEED = {"RECORD_STATUS_ACTIVITIES": True}
    with presence_settings(**LIMITED):
        user = await new_user(make_user)
        socket = await sockets.open(user)
        for n in range(5):
            await set_status(socket, status="auto", text=f"status {n}")
        count = await sync_to_async(Activity.objects.filter(author=user).count)()
        assert count == 3
