"""presence.room_sends: a room's announcements on one event loop, one message at a time; the
users announced meanwhile go together in the next message, each caller answered once its
users were sent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from presence import room_sends


class Layer:
    """Records each message; a send completes when the test releases it."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[Any], float]] = []
        self.release = asyncio.Event()

    async def send(self, room: str, users: list[Any], at: float) -> None:
        self.messages.append((room, users, at))
        await self.release.wait()
        self.release.clear()


async def test_announcements_made_while_one_is_sent_go_together_in_the_next() -> None:
    layer = Layer()
    first = asyncio.ensure_future(room_sends.send("r", [1], 5.0, layer.send))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert layer.messages == [("r", [1], 5.0)]  # alone: at once, nothing waited for
    later = [
        asyncio.ensure_future(room_sends.send("r", [uid], at, layer.send))
        for uid, at in ((2, 7.0), (3, 6.0), (2, 8.0))
    ]
    other = asyncio.ensure_future(room_sends.send("s", [9], 1.0, layer.send))
    await asyncio.sleep(0.01)
    assert not first.done() and not any(task.done() for task in later)
    layer.release.set()
    await asyncio.wait_for(first, 5)
    # Once the first is out, the three wait for one message: their users, once each, the
    # earliest change's time.
    await asyncio.sleep(0.01)
    assert ("r", [2, 3], 6.0) in layer.messages
    assert not any(task.done() for task in later)
    while not (all(task.done() for task in later) and other.done()):
        layer.release.set()
        await asyncio.sleep(0.01)
    assert sorted(layer.messages) == [("r", [1], 5.0), ("r", [2, 3], 6.0), ("s", [9], 1.0)]
    # Nothing left behind: the next announcement starts a message of its own.
    layer.release.set()
    await asyncio.wait_for(room_sends.send("r", [4], 9.0, layer.send), 5)
    assert layer.messages[-1] == ("r", [4], 9.0)


async def test_a_long_queue_goes_in_messages_of_at_most_max_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(room_sends, "MAX_USERS", 2)
    layer = Layer()
    first = asyncio.ensure_future(room_sends.send("r", [0], 1.0, layer.send))
    await asyncio.sleep(0.01)
    rest = asyncio.ensure_future(room_sends.send("r", [1, 2, 3, 4, 5], 2.0, layer.send))
    while not rest.done():
        layer.release.set()
        await asyncio.sleep(0.01)
    assert first.done()
    assert [users for _, users, _ in layer.messages] == [[0], [1, 2], [3, 4], [5]]


async def test_a_caller_cancelled_leaves_the_others_message_going() -> None:
    layer = Layer()
    first = asyncio.ensure_future(room_sends.send("r", [1], 1.0, layer.send))
    await asyncio.sleep(0.01)
    gone = asyncio.ensure_future(room_sends.send("r", [2], 1.0, layer.send))
    stays = asyncio.ensure_future(room_sends.send("r", [3], 1.0, layer.send))
    await asyncio.sleep(0.01)
    gone.cancel()
    while not stays.done():
        layer.release.set()
        await asyncio.sleep(0.01)
    assert first.done() and gone.cancelled()
    assert layer.messages[-1] == ("r", [2, 3], 1.0)


async def test_a_send_cancelled_leaves_no_caller_waiting() -> None:
    layer = Layer()
    first = asyncio.ensure_future(room_sends.send("r", [1], 1.0, layer.send))
    await asyncio.sleep(0.01)
    waiting = asyncio.ensure_future(room_sends.send("r", [2], 1.0, layer.send))
    await asyncio.sleep(0.01)
    (sender,) = room_sends._senders
    sender.cancel()
    for task in (first, waiting):
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
    # The room starts again with the next announcement.
    layer.release.set()
    await asyncio.wait_for(room_sends.send("r", [3], 1.0, layer.send), 5)


async def test_no_users_is_no_message_and_nobody_waits() -> None:
    """An announcement of nobody (a batch of joins whose users were in the room already) sends
    nothing and returns at once, also while the room's message is being sent."""
    layer = Layer()
    await asyncio.wait_for(room_sends.send("r", [], 1.0, layer.send), 5)
    assert layer.messages == []
    first = asyncio.ensure_future(room_sends.send("r", [1], 1.0, layer.send))
    await asyncio.sleep(0.01)
    await asyncio.wait_for(room_sends.send("r", [], 1.0, layer.send), 5)
    layer.release.set()
    await asyncio.wait_for(first, 5)
    assert layer.messages == [("r", [1], 1.0)]


async def test_a_sender_that_raises_fails_its_callers_and_the_next_message_goes() -> None:
    messages: list[list[Any]] = []
    release = asyncio.Event()

    async def failing_once(room: str, users: list[Any], at: float) -> None:
        messages.append(users)
        await release.wait()
        if len(messages) == 1:
            raise ConnectionError("the layer is down")

    first = asyncio.ensure_future(room_sends.send("r", [1], 1.0, failing_once))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(room_sends.send("r", [2], 1.0, failing_once))
    await asyncio.sleep(0.01)
    release.set()
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(first, 5)
    await asyncio.wait_for(second, 5)
    assert messages == [[1], [2]]
