"""The consumer's sending path (presence.consumers.PresenceConsumer.send and send_presences),
through WebsocketCommunicator on the real channels_redis layer and Redis: answers too large for
one frame are split, a server's refusal that is no disconnect is logged and answered, answers
weigh in the rate limit, and a server that takes no more (the client does not read) gets the
connection closed with 4408. tests/load/test_slow_clients.py drives the same through a real daphne.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from autobahn.exception import PayloadExceededError
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model

from presence import api, consumers
from presence.hub import Hub
from presence.models import Contact, UserStatus
from tests.live.sockets import (
    APP,
    TIMEOUT,
    Sockets,
    assert_silent,
    connections_in_redis,
    eventually,
    new_user,
    open_sockets,
    presence_settings,
    receive,
    state,
    subscribe,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
]

#: a custom status as long as TEXT_MAX_LENGTH allows, in letters JSON escapes (6 bytes each):
#: about 1.9 KB of JSON per presence
LONG = "é" * 140


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    async for opened in open_sockets():
        yield opened


def heavy_targets(viewer: Any, count: int, prefix: str = "heavy") -> list[Any]:
    """``count`` users with long custom statuses, each letting ``viewer`` see them (contacts)."""
    model = get_user_model()
    made = model.objects.bulk_create(
        [model(username=f"{prefix}{i}", password="!") for i in range(count)]
    )
    targets = list(model.objects.filter(username__in=[u.username for u in made]).order_by("pk"))
    UserStatus.objects.bulk_create(
        [UserStatus(user=t, text=LONG, emoji="😀" * 16, activity=LONG) for t in targets]
    )
    Contact.objects.bulk_create([Contact(owner=t, contact=viewer) for t in targets])
    return targets


async def frames_until(
    communicator: WebsocketCommunicator, done: Callable[[list[dict[str, Any]]], bool]
) -> list[str]:
    """The raw text of the frames received until ``done`` says the list is complete."""
    texts: list[str] = []
    for _ in range(100):  # bounded: far more frames than any answer here makes
        output = await communicator.receive_output(timeout=TIMEOUT)
        assert output["type"] == "websocket.send", output
        texts.append(output["text"])
        if done([json.loads(t) for t in texts]):
            return texts
    raise AssertionError("the answer never completed")


def covers(ids: set[str]) -> Callable[[list[dict[str, Any]]], bool]:
    def done(frames: list[dict[str, Any]]) -> bool:
        got = {key for f in frames for key in f.get("presences", {})}
        return got >= ids

    return done


async def test_a_snapshot_larger_than_a_frame_arrives_in_several_partial_states(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer = await new_user(make_user)
    targets = await sync_to_async(heavy_targets)(viewer, 200)  # ~390 KB of presences
    communicator = await sockets.open(viewer)
    ids = {str(t.pk) for t in targets}
    await communicator.send_json_to({"type": "subscribe", "users": [t.pk for t in targets]})
    texts = await frames_until(communicator, covers(ids))
    frames = [json.loads(t) for t in texts]
    # Several frames, each a partial map under the limit; together exactly the snapshot.
    assert len(frames) >= 2
    assert {f["type"] for f in frames} == {"presence_state"}
    assert all(len(t.encode()) <= consumers.SPLIT_FRAME_BYTES for t in texts)
    keys = [key for f in frames for key in f["presences"]]
    assert sorted(keys) == sorted(ids)  # no user twice
    assert {p["text"] for f in frames for p in f["presences"].values()} == {LONG}
    await assert_silent(communicator)


async def test_a_diff_larger_than_a_frame_arrives_in_several_partial_diffs(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer = await new_user(make_user)
    targets = await sync_to_async(heavy_targets)(viewer, 200)
    communicator = await sockets.open(viewer)
    ids = {str(t.pk) for t in targets}
    await communicator.send_json_to({"type": "subscribe", "users": [t.pk for t in targets]})
    await frames_until(communicator, covers(ids))
    # Each looks changed to this connection (as if the statuses it was shown were older): the
    # hub resolves them in one delivery, whose diff is as large as the snapshot.
    hub = Hub.current()
    assert hub is not None
    for connection in hub.registry.connections:
        for uid, shown in list(connection.sent.items()):
            connection.sent[uid] = replace(shown, text="old")
    hub.changed([t.pk for t in targets])
    texts = await frames_until(communicator, covers(ids))
    frames = [json.loads(t) for t in texts]
    assert len(frames) >= 2
    assert {f["type"] for f in frames} == {"presence_diff"}
    assert all(len(t.encode()) <= consumers.SPLIT_FRAME_BYTES for t in texts)


async def test_a_send_the_server_refuses_for_another_reason_is_logged_and_answered(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # daphne refuses a message over its size limit with autobahn's PayloadExceededError: the
    # client is still there, and must learn that its answer failed (it was taken for gone).
    user = await new_user(make_user)

    async def app_refusing_large_sends(scope: Any, receive_: Any, send: Any) -> None:
        async def server_send(message: dict[str, Any]) -> None:
            if message["type"] == "websocket.send" and len(message.get("text", "")) > 200:
                raise PayloadExceededError("tried to send WebSocket message with size ...")
            await send(message)

        await APP(scope, receive_, server_send)

    tab = sockets.make(user, app=app_refusing_large_sends)
    assert (await tab.connect(timeout=TIMEOUT))[0]
    assert await subscribe(tab) == state({})
    with caplog.at_level("DEBUG", logger="presence"):
        await tab.send_json_to({"type": "set_status", "status": "dnd", "text": "x" * 140})
        reply = await receive(tab)
    assert reply["type"] == "error" and reply["code"] == "internal_error"
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert errors and "PayloadExceededError" in caplog.text
    # Still served.
    assert await subscribe(tab) == state({})


async def test_the_size_of_answers_weighs_in_the_rate_limit(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer = await new_user(make_user)
    targets = await sync_to_async(heavy_targets)(viewer, 200)
    with presence_settings(RATE_LIMIT=(12, 10)):
        communicator = await sockets.open(viewer)  # 1 frame
        ids = {str(t.pk) for t in targets}
        await communicator.send_json_to({"type": "subscribe", "users": [t.pk for t in targets]})
        texts = await frames_until(communicator, covers(ids))  # 2 frames for 200 ids
        answered = sum(len(t.encode()) for t in texts)
        extra = answered // consumers.ANSWER_BYTES_PER_FRAME
        assert extra >= 4  # ~390 KB
        left = 12 - 3 - extra
        for _ in range(left):
            await communicator.send_json_to({"type": "heartbeat", "state": "active"})
        await assert_silent(communicator)
        await communicator.send_json_to({"type": "heartbeat", "state": "active"})
        assert await communicator.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4429,
        }


async def test_a_server_that_takes_no_more_gets_the_connection_closed_with_4408(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server that waits for the client to read before it takes a frame (uvicorn drains its
    # transport): a client that never reads holds the send; after SEND_TIMEOUT the connection
    # is closed as too slow, and other connections are served meanwhile.
    monkeypatch.setattr(consumers.sending, "SEND_TIMEOUT", 0.3)
    viewer, other = await new_user(make_user), await new_user(make_user)
    stuck = False
    closes: list[dict[str, Any]] = []

    async def app_with_a_full_pipe(scope: Any, receive_: Any, send: Any) -> None:
        async def server_send(message: dict[str, Any]) -> None:
            if stuck and message["type"] == "websocket.send":
                await asyncio.Event().wait()  # the client reads nothing
            if message["type"] == "websocket.close":
                closes.append(message)
            await send(message)

        await APP(scope, receive_, server_send)

    slow = sockets.make(viewer, app=app_with_a_full_pipe)
    assert (await slow.connect(timeout=TIMEOUT))[0]
    assert await subscribe(slow) == state({})
    fine = await sockets.open(other)
    stuck = True
    await slow.send_json_to({"type": "subscribe", "users": []})
    for _ in range(50):  # bounded: the close comes after SEND_TIMEOUT
        if closes:
            break
        await asyncio.sleep(0.05)
    assert closes == [{"type": "websocket.close", "code": consumers.CLOSE_TOO_SLOW}]
    assert await subscribe(fine) == state({})


def _stuck_app(stuck: list[bool], closes: list[dict[str, Any]]) -> Any:
    """The test app behind a server that holds every send once ``stuck[0]`` (a client that
    reads nothing, on a server that waits for it), recording its closes."""

    async def app(scope: Any, receive_: Any, send: Any) -> None:
        async def server_send(message: dict[str, Any]) -> None:
            if stuck[0] and message["type"] == "websocket.send":
                await asyncio.Event().wait()
            if message["type"] == "websocket.close":
                closes.append(message)
            await send(message)

        await APP(scope, receive_, server_send)

    return app


async def test_the_last_connection_closed_as_too_slow_by_a_diff_signs_its_user_off(
    sockets: Sockets, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The diff that finds the process's last connection too slow is sent by one of the hub's
    tasks, which the connection's leaving stops: the leaving still ends its presence at once."""
    monkeypatch.setattr(consumers.sending, "SEND_TIMEOUT", 0.3)
    viewer, target = await new_user(make_user), await new_user(make_user)
    await sync_to_async(Contact.objects.create)(owner=target, contact=viewer)
    stuck, closes = [False], []
    slow = sockets.make(viewer, app=_stuck_app(stuck, closes))
    assert (await slow.connect(timeout=TIMEOUT))[0]
    await subscribe(slow, target)
    assert await connections_in_redis(viewer)
    stuck[0] = True
    await api.atouch(target, "web")  # online: a diff for the slow connection
    assert await eventually(lambda: closes)
    assert closes == [{"type": "websocket.close", "code": consumers.CLOSE_TOO_SLOW}]
    assert await eventually(lambda: _none(connections_in_redis(viewer)))


async def _none(found: Any) -> bool:
    return not await found


async def test_a_connection_closed_as_too_slow_by_the_online_count_tells_its_watchers(
    sockets: Sockets, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The online count's task finds a watcher too slow; its leaving stops that task (its last
    watcher): the user's other devices' watchers are still told it left."""
    monkeypatch.setattr(consumers.sending, "SEND_TIMEOUT", 0.3)
    user, watcher, newcomer = [await new_user(make_user) for _ in range(3)]
    await sync_to_async(Contact.objects.create)(owner=user, contact=watcher)
    watching = await sockets.open(watcher)
    await sockets.open(user, "?device=mobile")
    stuck, closes = [False], []
    slow = sockets.make(user, app=_stuck_app(stuck, closes))
    assert (await slow.connect(timeout=TIMEOUT))[0]
    await subscribe(watching, user)
    await slow.send_json_to({"type": "watch_count"})
    assert (await receive(slow))["type"] == "online_count"
    stuck[0] = True
    await api.atouch(newcomer, "web")  # the count changes: sent to the slow connection
    assert await eventually(lambda: closes)
    # Its watcher is shown the web device gone, as after any close.
    for _ in range(10):
        diff = await receive(watching)
        if diff.get("type") == "presence_diff":
            devices = diff["presences"][str(user.pk)]["devices"]
            if "web" not in devices:
                break
    else:
        raise AssertionError("the watcher was never told the web device left")
    assert devices == ["mobile"]


@pytest.mark.parametrize("slow_first", [True, False])
async def test_a_client_that_reads_nothing_holds_up_no_other_connection_s_diff(
    sockets: Sockets,
    make_user: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    slow_first: bool,
) -> None:
    """On a server that waits for its client (uvicorn), the fan-out's send to a client that
    reads nothing waits up to SEND_TIMEOUT: the other connections of the same diff get theirs
    meanwhile, whichever was opened and subscribed first."""
    monkeypatch.setattr(consumers.sending, "SEND_TIMEOUT", 5.0)
    slow_user, fine_user, target = [await new_user(make_user) for _ in range(3)]
    for viewer in (slow_user, fine_user):
        await sync_to_async(Contact.objects.create)(owner=target, contact=viewer)
    stuck, closes = [False], []
    slow = sockets.make(slow_user, app=_stuck_app(stuck, closes))
    if not slow_first:
        fine = await sockets.open(fine_user)
        await subscribe(fine, target)
    assert (await slow.connect(timeout=TIMEOUT))[0]
    await subscribe(slow, target)
    if slow_first:
        fine = await sockets.open(fine_user)
        await subscribe(fine, target)
    stuck[0] = True
    await api.atouch(target, "web")
    diff = await fine.receive_json_from(timeout=1.0)  # not after the slow one's SEND_TIMEOUT
    assert diff["type"] == "presence_diff" and str(target.pk) in str(diff["presences"])
