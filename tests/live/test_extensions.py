"""presence.extensions: an installed app adds WebSocket frame types and hub topics with
deliveries, without presence naming them. The app here is a small "typing…" indicator, as in
docs/extending.md."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from presence import extensions
from presence.announce import topic_group_name
from presence.domain import InvalidInput
from presence.hub import Hub
from tests.live.sockets import (
    Sockets,
    assert_silent,
    error,
    new_user,
    open_sockets,
    receive,
    state,
    subscribe,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
]


# --- the "typing" app -------------------------------------------------------------------------


def parse_typing(data: Mapping[str, Any]) -> int:
    to = data.get("to")
    if isinstance(to, bool) or not isinstance(to, int):
        raise InvalidInput("invalid_message", "'to' must be a user id.")
    return to


async def handle_typing(connection: Any, to: int) -> None:
    await extensions.aannounce_to_topic("typing", {"from": connection.viewer_id, "to": to})


def parse_listen(data: Mapping[str, Any]) -> None:
    return None


async def handle_listen(connection: Any, message: None) -> None:
    await connection.hub.join_topic(connection, "typing", "me")


async def deliver_typing(hub: Hub, payload: Any) -> None:
    for connection in hub.topic_members("typing"):
        if connection.viewer_id == payload["to"]:
            await connection.send_json({"type": "typing", "from": payload["from"]})


@pytest.fixture
def typing_app() -> Iterator[None]:
    frames, deliveries = dict(extensions._frames), dict(extensions._deliveries)
    extensions.register_frame("typing", parse_typing, handle_typing)
    extensions.register_frame("listen_typing", parse_listen, handle_listen)
    extensions.register_delivery("typing", deliver_typing)
    yield
    extensions._frames.clear()
    extensions._frames.update(frames)
    extensions._deliveries.clear()
    extensions._deliveries.update(deliveries)


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    async for opened in open_sockets():
        yield opened


def topic_members_in_redis(client: redis.Redis, kind: str) -> list[str]:
    key = f"{get_channel_layer().prefix}:group:{topic_group_name(kind)}"
    return list(client.zrange(key, 0, -1))


# --- tests ------------------------------------------------------------------------------------


async def test_an_added_frame_type_and_topic_deliver_to_the_listening_connection_only(
    typing_app: None, sockets: Sockets, make_user: Callable[..., Any], redis_client: redis.Redis
) -> None:
    alice, bob, carol = [await new_user(make_user) for _ in range(3)]
    alice_socket = await sockets.open(alice)
    bob_socket = await sockets.open(bob)
    carol_socket = await sockets.open(carol)
    hub = Hub.current()
    assert hub is not None
    assert topic_members_in_redis(redis_client, "typing") == []

    await bob_socket.send_json_to({"type": "listen_typing"})
    assert await subscribe(bob_socket) == state({})  # frames are handled in order
    # The process joined the topic kind's channel-layer group for bob's topic.
    assert topic_members_in_redis(redis_client, "typing") == [hub.groups.channel]

    await alice_socket.send_json_to({"type": "typing", "to": bob.pk})
    assert await receive(bob_socket) == {"type": "typing", "from": alice.pk}
    await assert_silent(alice_socket, carol_socket)

    # Closing the connection drops its topics, and the process leaves the group.
    await sockets.close(bob_socket)
    assert hub.topic_members("typing") == {}
    assert topic_members_in_redis(redis_client, "typing") == []


async def test_announcing_from_sync_code_reaches_the_topic(
    typing_app: None, sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    alice, bob = [await new_user(make_user) for _ in range(2)]
    bob_socket = await sockets.open(bob)
    await bob_socket.send_json_to({"type": "listen_typing"})
    assert await subscribe(bob_socket) == state({})
    await sync_to_async(extensions.announce_to_topic)("typing", {"from": alice.pk, "to": bob.pk})
    assert await receive(bob_socket) == {"type": "typing", "from": alice.pk}


async def test_a_bad_added_frame_is_answered_and_the_connection_stays(
    typing_app: None, sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    socket = await sockets.open(await new_user(make_user))
    await socket.send_json_to({"type": "typing", "to": "bob"})
    assert await receive(socket) == error(
        "invalid_message", "'to' must be a user id.", answers="typing"
    )
    await socket.send_json_to({"type": "ping"})
    frame = await receive(socket)
    assert frame["code"] == "unknown_type"
    assert "typing" in frame["message"] and "listen_typing" in frame["message"]
    assert await subscribe(socket) == state({})


def parse_doc(data: Mapping[str, Any]) -> str:
    doc = data.get("doc")
    if not isinstance(doc, str) or not doc.isdigit():
        raise InvalidInput("invalid_value", "'doc' is a document's number.")
    return doc


async def handle_doc(connection: Any, doc: str) -> None:
    raise InvalidInput("not_found", f"No document {doc}.")


async def test_errors_answering_an_added_frame_name_the_field_it_is_named_by(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    frames = dict(extensions._frames)
    extensions.register_frame("open_doc", parse_doc, handle_doc, named_by="doc")
    try:
        socket = await sockets.open(await new_user(make_user))
        # As the frame sent it, from its parse and from its handler; nothing where it is no
        # string, and nothing on the errors of other frames. Each names its frame's type.
        bad_doc = "'doc' is a document's number."
        for frame, expected in [
            ({"doc": "x"}, error("invalid_value", bad_doc, doc="x", answers="open_doc")),
            ({"doc": "7"}, error("not_found", "No document 7.", doc="7", answers="open_doc")),
            ({"doc": 7}, error("invalid_value", bad_doc, answers="open_doc")),
        ]:
            await socket.send_json_to({"type": "open_doc", **frame})
            assert await receive(socket) == expected
        await socket.send_json_to({"type": "heartbeat", "state": "asleep", "doc": "7"})
        assert "doc" not in await receive(socket)
    finally:
        extensions._frames.clear()
        extensions._frames.update(frames)


@pytest.mark.parametrize("field", ["code", "message", "type", "room", "answers", 7])
def test_an_added_frame_is_named_by_none_of_an_errors_own_fields(field: Any) -> None:
    with pytest.raises(ValueError):
        extensions.register_frame("open_doc", parse_doc, handle_doc, named_by=field)
    assert "open_doc" not in extensions.frame_parsers()


def test_presence_frame_types_cannot_be_replaced() -> None:
    with pytest.raises(ValueError):
        extensions.register_frame("subscribe", parse_typing, handle_typing)
    assert "subscribe" not in extensions.frame_parsers()


@pytest.mark.parametrize("kind", ["", "a b", "x" * 41, "typing:1", "typing\n"])
def test_topic_kinds_must_fit_a_channel_group_name(kind: str) -> None:
    with pytest.raises(ValueError):
        extensions.register_delivery(kind, deliver_typing)
