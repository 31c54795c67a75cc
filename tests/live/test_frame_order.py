"""A presence map split over several frames goes out whole before any diff to the same socket,
under a server whose send waits (uvicorn: its send waits while the client's transport is over
its high-water mark; daphne's never does). Else a diff could slip in between the frames of a
snapshot, and a later frame, read before the change, would undo it in the client's merged map.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async

from presence import consumers
from tests.live.sockets import APP, TIMEOUT, Sockets, new_user, open_sockets, set_status, subscribe
from tests.live.test_sending import heavy_targets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
]


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    async for opened in open_sockets():
        yield opened


async def test_a_diff_waits_for_the_last_frame_of_a_split_snapshot(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(consumers.sending, "SPLIT_FRAME_BYTES", 6000)  # ~3 presences a frame
    viewer = await new_user(make_user)
    targets = await sync_to_async(heavy_targets)(viewer, 12)
    changed = targets[-1]  # in the snapshot's last frame
    tab = await sockets.open(changed)
    assert await subscribe(tab) == {"type": "presence_state", "presences": {}}
    first_frame_out, drained = asyncio.Event(), asyncio.Event()

    async def app_whose_send_waits(scope: Any, receive_: Any, send: Any) -> None:
        async def server_send(message: dict[str, Any]) -> None:
            await send(message)
            text = message.get("text") or ""
            if '"presence_state"' in text and not first_frame_out.is_set():
                first_frame_out.set()
                await drained.wait()  # the client reads slowly: the send waits for it

        await APP(scope, receive_, server_send)

    slow = sockets.make(viewer, app=app_whose_send_waits)
    assert (await slow.connect(timeout=TIMEOUT))[0]
    await slow.send_json_to({"type": "subscribe", "users": [t.pk for t in targets]})
    await asyncio.wait_for(first_frame_out.wait(), TIMEOUT)
    # The changed user's status changes while the snapshot is going out; the hub has time to
    # deliver its diff (COALESCE_WINDOW 0.05 s) before the server takes the next frame.
    assert (await set_status(tab, status="dnd"))["type"] == "status"
    await asyncio.sleep(0.5)
    drained.set()

    # Every frame until the snapshot covers every target and the diff came.
    ids, frames, merged = {str(t.pk) for t in targets}, [], {}
    while set(merged) != ids or not any(f["type"] == "presence_diff" for f in frames):
        frames.append(json.loads(await slow.receive_from(timeout=TIMEOUT)))
        merged.update(frames[-1]["presences"])
    kinds = [f["type"] for f in frames]
    assert kinds == ["presence_state"] * (len(kinds) - 1) + ["presence_diff"], kinds
    assert len(kinds) >= 4  # the snapshot was split
    # The client's merged map ends with the change, not with the snapshot's older reading.
    assert merged[str(changed.pk)]["status"] == "dnd"
