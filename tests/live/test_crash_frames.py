"""The WebSocket consumer at ws/presence/: crash frames and failures inside handlers.

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
import time_machine
from asgiref.sync import sync_to_async

from presence import lifecycle
from presence.hub import Hub
from presence.models import UserStatus
from tests.live.sockets import (
    APP,
    HIDDEN,
    TIMEOUT,
    Sockets,
    assert_silent,
    connections_in_redis,
    database_state,
    diff,
    error,
    eventually,
    iso,
    lets_see,
    new_user,
    online,
    presence,
    presence_settings,
    receive,
    redis_state,
    send_frame,
    set_status,
    state,
    status_reply,
    subscribe,
    subscriptions,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]


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
            "internal_error",
            "The server failed to handle this frame; try again later.",
            answers="subscribe",
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
    # (Other refusals are failures: tests/live/test_sending.py.)
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
    # presence's own records: asyncio's "Unclosed RedisCluster client" of an earlier test's
    # client, collected while this test's loop runs (the cluster run), is not this test's.
    assert not [r for r in caplog.records if r.levelname == "ERROR" and r.name == "presence"]
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
    assert hub is not None and len(hub.registry.connections) == 2 and hub.topic_members("feed")
    assert await connections_in_redis(viewer) != []

    # The server cancels the application (as daphne does at shutdown or after a close
    # timeout): no websocket.disconnect is ever handled.
    communicator.future.cancel()

    async def gone() -> bool:
        return await connections_in_redis(viewer) == []

    assert await eventually(gone)
    assert len(hub.registry.connections) == 1
    assert hub.registry.watchers.members == {}
    assert hub.registry.watchers.of == {}  # nor any connection's list of them
    assert hub.registry.topics.members == {}
    # The other connection is unaffected.
    assert await subscribe(keeper, target) == state({target.pk: online(invisible=False)})
