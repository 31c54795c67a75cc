"""The WebSocket's rooms: join/leave frames, room_state and room_diff per viewer, bad input,
the grace, crashes, coalescing (real Redis, real channel layer, WebsocketCommunicator).

Helpers: tests/live/sockets.py; time is moved with time_machine and the rooms are swept by
calling the sweep (never by sleeping past a timeout).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from presence import announce, api, consumers
from presence.hub import Hub, room_refresh
from presence.hub import rooms as hub_rooms
from presence.models import Block, PrivacySettings
from presence.routing import websocket_urlpatterns
from presence.store.plans import rooms as room_plans
from presence.store.scripts import Script
from presence.tokens import TokenAuthMiddleware, issue_token
from tests.live.sockets import (
    BASE,
    QUIET,
    TIMEOUT,
    Sockets,
    Stall,
    assert_silent,
    error,
    lets_see,
    new_user,
    receive,
    send_frame,
)
from tests.live.sockets import sockets as sockets
from tests.rooms.rules import ROOMS, WITH_A_MISSING_RULE

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]

ROOM = "post:1"
SETTINGS = {**BASE, "ROOMS": ROOMS, "OFFLINE_GRACE": 5, "CONNECTION_TTL": 90}


@pytest.fixture(autouse=True)
def _room_settings(settings: Any) -> None:
    settings.PRESENCE = dict(SETTINGS)


def key(user: Any) -> str:
    return str(user.pk)


@sync_to_async
def public(*users: Any) -> None:
    for user in users:
        PrivacySettings.objects.update_or_create(
            user=user, defaults={"online_visibility": "everyone"}
        )


async def join(
    communicator: WebsocketCommunicator, room: str = ROOM, meta: Any = None
) -> dict[str, Any]:
    await communicator.send_json_to({"type": "join", "room": room, "meta": meta})
    return await receive(communicator)


async def leave(communicator: WebsocketCommunicator, room: str = ROOM) -> None:
    await communicator.send_json_to({"type": "leave", "room": room})


def members(frame: dict[str, Any]) -> set[str]:
    return set(frame["members"])


class ClientView:
    """A room as a client keeps it from room_state and room_diff frames (as presence.js does)."""

    def __init__(self, state: dict[str, Any]) -> None:
        assert state["type"] == "room_state", state
        self.room = state["room"]
        self.members = dict(state["members"])
        self.others = state["others"]
        self.count = state["count"]
        self.frames = 0

    def apply(self, frame: dict[str, Any]) -> None:
        assert frame["type"] == "room_diff" and frame["room"] == self.room, frame
        for uid in frame["leaves"]:
            del self.members[uid]
        self.members.update(frame["joins"])
        self.others, self.count = frame["others"], frame["count"]
        assert self.count == len(self.members) + self.others
        self.frames += 1

    def shows(self, listed: set[str], others: int) -> bool:
        return set(self.members) == listed and self.others == others

    async def until(
        self, communicator: WebsocketCommunicator, listed: set[str], others: int
    ) -> ClientView:
        """Apply the frames that come until the view lists ``listed`` with ``others``."""
        while not self.shows(listed, others):
            self.apply(await receive(communicator))
        return self


async def test_join_answers_the_room_state(sockets: Sockets, make_user: Callable) -> None:
    alice = await new_user(make_user)
    socket = await sockets.open(alice)
    frame = await join(socket, meta={"mode": "reading"})
    assert frame["type"] == "room_state"
    assert frame["room"] == ROOM
    assert frame["count"] == 1 and frame["others"] == 0
    me = frame["members"][key(alice)]
    assert me["meta"] == {"mode": "reading"}
    assert me["presence"]["status"] == "online"


async def test_viewers_see_joins_and_meta_changes(sockets: Sockets, make_user: Callable) -> None:
    alice, bob = await new_user(make_user), await new_user(make_user)
    await public(alice, bob)
    a = await sockets.open(alice)
    b = await sockets.open(bob)
    seen = ClientView(await join(a))
    state = await join(b, meta={"mode": "editing"})
    assert members(state) == {key(alice), key(bob)}
    await seen.until(a, {key(alice), key(bob)}, 0)
    assert seen.members[key(bob)]["meta"] == {"mode": "editing"}
    assert seen.members[key(bob)]["presence"]["status"] == "online"
    # Joining again replaces the meta: a room_state to the joiner, a diff to the others.
    again = await join(b, meta={"mode": "reading"})
    assert again["members"][key(bob)]["meta"] == {"mode": "reading"}
    changed = await receive(a)
    assert changed["joins"][key(bob)]["meta"] == {"mode": "reading"}
    assert changed["leaves"] == [] and changed["count"] == 2
    await assert_silent(a, b)


async def test_each_viewer_sees_what_privacy_lets_them(
    sockets: Sockets, make_user: Callable
) -> None:
    viewer, friend, stranger = [await new_user(make_user) for _ in range(3)]
    invisible = await new_user(make_user)
    await lets_see(friend, viewer)
    await sync_to_async(PrivacySettings.objects.create)(user=invisible, invisible=True)
    v = await sockets.open(viewer)
    seen = ClientView(await join(v))
    # A hidden member: counted in others, not listed.
    s = await sockets.open(stranger)
    seen_by_stranger = ClientView(await join(s))
    await seen.until(v, {key(viewer)}, 1)
    # A member who lets the viewer see them: listed.
    f = await sockets.open(friend)
    await join(f)
    await seen.until(v, {key(viewer), key(friend)}, 1)
    # The stranger sees nobody listed (default privacy is contacts) but counts them.
    await seen_by_stranger.until(s, {key(stranger)}, 2)
    # An invisible member: neither listed nor counted, so nothing at all is sent.
    i = await sockets.open(invisible)
    state = await join(i)
    assert members(state) == {key(invisible)}
    assert state["members"][key(invisible)]["presence"]["invisible"] is True
    assert state["count"] == 4 and state["others"] == 3  # the others hidden from them
    await assert_silent(v, s, f)
    assert (seen.count, seen_by_stranger.count) == (3, 3)


async def test_a_block_updates_open_views(sockets: Sockets, make_user: Callable) -> None:
    alice, bob = await new_user(make_user), await new_user(make_user)
    await public(alice, bob)
    a = await sockets.open(alice)
    b = await sockets.open(bob)
    seen_by_alice = ClientView(await join(a))
    seen_by_bob = ClientView(await join(b))
    await seen_by_alice.until(a, {key(alice), key(bob)}, 0)
    await sync_to_async(Block.objects.create)(blocker=bob, blocked=alice)
    await seen_by_alice.until(a, {key(alice)}, 0)
    await seen_by_bob.until(b, {key(bob)}, 0)
    assert seen_by_alice.count == seen_by_bob.count == 1
    await assert_silent(a, b)


async def test_going_invisible_leaves_every_view(sockets: Sockets, make_user: Callable) -> None:
    alice, bob = await new_user(make_user), await new_user(make_user)
    await public(alice, bob)
    a = await sockets.open(alice)
    b = await sockets.open(bob)
    seen = ClientView(await join(a))
    await join(b)
    await seen.until(a, {key(alice), key(bob)}, 0)
    await b.send_json_to({"type": "set_status", "status": "invisible"})
    assert (await receive(b))["type"] == "status"
    await seen.until(a, {key(alice)}, 0)
    assert seen.count == 1
    # Back: listed again.
    await b.send_json_to({"type": "set_status", "status": "auto"})
    await receive(b)
    await seen.until(a, {key(alice), key(bob)}, 0)
    await assert_silent(a)


BAD = [
    ({"type": "join"}, "invalid_message"),
    ({"type": "join", "room": 42}, "invalid_message"),
    ({"type": "join", "room": ["post", "1"]}, "invalid_message"),
    ({"type": "join", "room": "post"}, "invalid_value"),
    ({"type": "join", "room": "post:a b"}, "invalid_value"),
    ({"type": "join", "room": "Post:1"}, "invalid_value"),
    ({"type": "join", "room": "post:" + "x" * 65}, "invalid_value"),
    ({"type": "join", "room": "nope:1"}, "unknown_room"),
    ({"type": "join", "room": "group:3"}, "forbidden"),
    ({"type": "join", "room": ROOM, "meta": "editing"}, "invalid_message"),
    ({"type": "join", "room": ROOM, "meta": [1]}, "invalid_message"),
    ({"type": "join", "room": ROOM, "meta": {"k": "x" * 600}}, "invalid_value"),
    ({"type": "leave"}, "invalid_message"),
    ({"type": "leave", "room": "post:"}, "invalid_value"),
]


@pytest.mark.parametrize(("frame", "code"), BAD)
async def test_bad_input_is_refused_and_changes_nothing(
    sockets: Sockets, make_user: Callable, frame: dict[str, Any], code: str, redis_client: Any
) -> None:
    alice = await new_user(make_user)
    socket = await sockets.open(alice)
    await socket.send_json_to(frame)
    reply = await receive(socket)
    assert reply["type"] == "error" and reply["code"] == code, reply
    # Named by the room as sent, where it is a string: the client tells it from other answers.
    sent_room = frame.get("room")
    assert reply.get("room") == (sent_room if isinstance(sent_room, str) else None), reply
    assert [k for k in redis_client.scan_iter("*room*")] == []
    # The connection goes on.
    assert (await join(socket))["type"] == "room_state"


@pytest.mark.parametrize(
    "text",
    [
        '{"type": "join", "room": "post:\\ud800"}',
        '{"type": "join", "room": "post:1", "meta": {"k": "\\ud800"}}',
        '{"type": "join", "room": "post:1", "meta": {"\\udfff": 1}}',
    ],
)
async def test_lone_surrogates_are_refused(
    sockets: Sockets, make_user: Callable, text: str
) -> None:
    socket = await sockets.open(await new_user(make_user))
    await send_frame(socket, text)
    assert (await receive(socket))["code"] == "invalid_value"


async def test_a_rule_that_raises_refuses_and_is_logged(
    sockets: Sockets, make_user: Callable, caplog: Any
) -> None:
    socket = await sockets.open(await new_user(make_user))
    with caplog.at_level(logging.ERROR, logger="presence"):
        reply = await join(socket, "broken:1")
    assert reply["code"] == "forbidden"
    assert "RuntimeError" in caplog.text
    assert (await join(socket, "group:2"))["type"] == "room_state"


async def test_a_rule_that_does_not_import_refuses(
    sockets: Sockets, make_user: Callable, settings: Any
) -> None:
    settings.PRESENCE = {**SETTINGS, "ROOMS": WITH_A_MISSING_RULE}
    socket = await sockets.open(await new_user(make_user))
    assert (await join(socket, "missing:1"))["code"] == "forbidden"
    assert (await join(socket, "raising:1"))["code"] == "forbidden"
    assert (await join(socket, "group:2"))["type"] == "room_state"  # the socket goes on


async def test_a_cancelled_error_below_a_frame_is_an_internal_error_not_a_dead_socket(
    sockets: Sockets, make_user: Callable, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CancelledError raised by something a frame's answer awaited (a bug below, not the
    connection's cancellation) is logged and told as internal_error; the socket goes on."""
    from presence.rooms.joins import JoinBatches

    real_join = JoinBatches.join

    async def cancelled_once(self: Any, room: Any, joining: Any) -> Any:
        monkeypatch.setattr(JoinBatches, "join", real_join)
        raise asyncio.CancelledError()

    monkeypatch.setattr(JoinBatches, "join", cancelled_once)
    socket = await sockets.open(await new_user(make_user))
    with caplog.at_level(logging.ERROR, logger="presence"):
        reply = await join(socket, "group:2")
    assert reply == {**reply, "type": "error", "code": "internal_error", "room": "group:2"}
    assert "cancelled below it" in caplog.text
    assert (await join(socket, "group:2"))["type"] == "room_state"


async def test_too_many_rooms(sockets: Sockets, make_user: Callable, settings: Any) -> None:
    settings.PRESENCE = {**SETTINGS, "MAX_ROOMS": 2}
    socket = await sockets.open(await new_user(make_user))
    await join(socket, "post:1")
    await join(socket, "post:2")
    reply = await join(socket, "post:3")
    assert reply == error(
        "too_many_rooms",
        "A connection may be in at most 2 rooms; leave one first.",
        room="post:3",
        answers="join",
    )
    # Joining a room it is in again is no new room; leaving one makes room.
    assert (await join(socket, "post:2"))["type"] == "room_state"
    await leave(socket, "post:1")
    assert (await join(socket, "post:3"))["type"] == "room_state"


async def test_errors_answering_a_rooms_frame_name_the_room_and_no_others_do(
    sockets: Sockets, make_user: Callable, settings: Any
) -> None:
    """Errors carry no request id: a client tells a join's refusal from the answer of its
    set_status by the room the error names (presence.js rejected a pending setStatus with a
    refused join's error, and could not record the refusal)."""
    settings.PRESENCE = {**SETTINGS, "MAX_ROOMS": 1}
    socket = await sockets.open(await new_user(make_user))
    assert (await join(socket, "post:1"))["type"] == "room_state"
    answers: list[tuple[dict[str, Any], str]] = [
        ({"type": "join", "room": "post:2"}, "too_many_rooms"),
        ({"type": "join", "room": "post:1", "meta": {"note": "x" * 600}}, "invalid_value"),
        ({"type": "join", "room": "post:1", "meta": "editing"}, "invalid_message"),
        ({"type": "leave", "room": "post:a b"}, "invalid_value"),
        ({"type": "room_more", "room": "post:1", "after": 5}, "invalid_message"),
        ({"type": "room_more", "room": "Post:1", "after": "x"}, "invalid_value"),
    ]
    for frame, code in answers:
        await socket.send_json_to(frame)
        reply = await receive(socket)
        assert (reply["type"], reply["code"], reply.get("room")) == (
            "error",
            code,
            frame["room"],
        ), reply
    await leave(socket, "post:1")
    for room, code in [("group:3", "forbidden"), ("nope:1", "unknown_room")]:
        reply = await join(socket, room)
        assert (reply["type"], reply["code"], reply.get("room")) == ("error", code, room), reply
    # A set_status's error names no room.
    await socket.send_json_to({"type": "set_status", "status": "away"})
    assert "room" not in await receive(socket)


async def test_leaving_a_room_never_joined_is_a_no_op(
    sockets: Sockets, make_user: Callable
) -> None:
    socket = await sockets.open(await new_user(make_user))
    await leave(socket, "post:9")
    await assert_silent(socket)
    assert (await join(socket))["count"] == 1


async def test_joins_count_against_the_rate_limit(
    sockets: Sockets, make_user: Callable, settings: Any
) -> None:
    settings.PRESENCE = {**SETTINGS, "RATE_LIMIT": (4, 60)}
    socket = sockets.make(await new_user(make_user))
    assert (await socket.connect())[0]
    for n in range(4):
        await socket.send_json_to({"type": "join", "room": f"post:{n}"})
    for _ in range(4):
        assert (await receive(socket))["type"] == "room_state"
    await socket.send_json_to({"type": "join", "room": "post:9"})
    assert (await socket.receive_output(timeout=3))["code"] == 4429


def _json_size(frame: dict[str, Any]) -> int:
    return len(json.dumps(frame))


async def test_a_joiner_is_in_its_own_room_state_when_redis_lost_the_join_script(
    sockets: Sockets, make_user: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The join's write and its read go in one round trip, the read after the write. Redis lost
    # the join's script but not the read's (another process read a room since): the read, run
    # before the join is sent again, must not be the joiner's answer.
    alice, bob = await new_user(make_user), await new_user(make_user)
    await public(alice, bob)
    a, b = await sockets.open(alice), await sockets.open(bob)
    seen = ClientView(await join(a))
    lost = Script(f"{room_plans.ROOM_JOIN.source}\n-- {uuid.uuid4()}\n")  # a sha Redis lacks
    monkeypatch.setattr(room_plans, "ROOM_JOIN", lost)
    state = await join(b)
    assert members(state) == {key(alice), key(bob)} and state["count"] == 2, state
    await seen.until(a, {key(alice), key(bob)}, 0)


def held_cards(monkeypatch: pytest.MonkeyPatch, module: Any) -> tuple[asyncio.Event, asyncio.Event]:
    """``module``'s cards lookup (the hub's delivery's, or a refresh's) held until let go, as a
    busy database thread holds it: (reached, let_go)."""
    real = module.add_cards
    reached, let_go = asyncio.Event(), asyncio.Event()

    async def held(frames: Any) -> None:
        reached.set()
        await let_go.wait()
        await real(frames)

    monkeypatch.setattr(module, "add_cards", held)
    return reached, let_go


async def three_in_the_room(
    sockets: Sockets, make_user: Callable, room: str = ROOM
) -> tuple[list[Any], list[WebsocketCommunicator]]:
    """Three users' sockets in ``room``, each shown all three."""
    users = [await new_user(make_user) for _ in range(3)]
    await public(*users)
    opened = [await sockets.open(user) for user in users]
    views = [ClientView(await join(socket, room)) for socket in opened]
    for socket, view in zip(opened, views, strict=True):
        await view.until(socket, {key(user) for user in users}, 0)
    return users, opened


async def test_a_room_diff_under_way_is_not_sent_after_a_leave(
    sockets: Sockets, make_user: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    users, (a, b, c) = await three_in_the_room(sockets, make_user)
    reached, let_go = held_cards(monkeypatch, hub_rooms)
    # Carol's meta changes: the room's delivery to Alice's and Bob's views begins...
    assert (await join(c, meta={"mode": "editing"}))["type"] == "room_state"
    await asyncio.wait_for(reached.wait(), TIMEOUT)
    # ...and Bob leaves before it is sent: out of the room, no more frames of it.
    await leave(b)
    assert (await join(b, "post:2"))["type"] == "room_state"  # (the leave was handled)
    let_go.set()
    changed = await receive(a)
    assert changed["joins"][key(users[2])]["meta"] == {"mode": "editing"}
    await assert_silent(b)


async def test_a_room_diff_under_way_is_not_sent_to_a_view_left_and_joined_again(
    sockets: Sockets, make_user: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    users, (a, b, c) = await three_in_the_room(sockets, make_user)
    reached, let_go = held_cards(monkeypatch, hub_rooms)
    assert (await join(c, meta={"mode": "editing"}))["type"] == "room_state"
    await asyncio.wait_for(reached.wait(), TIMEOUT)
    # Bob leaves and joins again: his new room_state, read after Carol's change, shows it; the
    # diff made for the view he left must not follow it.
    await leave(b)
    state = await join(b)
    assert state["members"][key(users[2])]["meta"] == {"mode": "editing"}
    let_go.set()
    assert (await receive(a))["type"] == "room_diff"
    await assert_silent(b)


async def test_a_refresh_under_way_sends_no_room_state_after_a_leave(
    sockets: Sockets, make_user: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = await new_user(make_user)
    socket = await sockets.open(alice)
    await join(socket)
    hub = Hub.current()
    assert hub is not None
    reached, let_go = held_cards(monkeypatch, room_refresh)
    announce.note_layer_failure()  # announcements may have been lost: every view refreshed
    refreshing = asyncio.ensure_future(hub.rooms.sweep())
    await asyncio.wait_for(reached.wait(), TIMEOUT)
    await leave(socket)
    assert (await join(socket, "post:2"))["type"] == "room_state"  # (the leave was handled)
    let_go.set()
    await asyncio.wait_for(refreshing, TIMEOUT)
    await assert_silent(socket)


async def test_a_refresh_under_way_sends_no_room_state_after_a_join_again(
    sockets: Sockets, make_user: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A join again while a refresh reads the view reads the room anew (the same view, a new
    generation): the refresh's older room_state is neither shown nor sent after the join's."""
    alice = await new_user(make_user)
    socket = await sockets.open(alice)
    await join(socket)
    hub = Hub.current()
    assert hub is not None
    reached, let_go = held_cards(monkeypatch, room_refresh)
    announce.note_layer_failure()  # announcements may have been lost: every view refreshed
    refreshing = asyncio.ensure_future(hub.rooms.sweep())
    await asyncio.wait_for(reached.wait(), TIMEOUT)  # the refresh's read is done
    again = await join(socket, meta={"mode": "back"})
    assert again["members"][key(alice)]["meta"] == {"mode": "back"}, again
    let_go.set()
    await asyncio.wait_for(refreshing, TIMEOUT)
    await assert_silent(socket)
    # The view shows the join again's state (its diffs are made from it).
    ((connection, views),) = hub.rooms.views.items()
    view = views[ROOM]
    assert not view.reading
    assert json.loads(view.listed[connection.viewer_id].meta or "null") == {"mode": "back"}


async def _room_with_a_slow_reader(
    sockets: Sockets, make_user: Callable, stall: Stall
) -> tuple[list[Any], list[WebsocketCommunicator]]:
    """Three users' sockets in ROOM, each shown all three; the second's client is ``stall``'s."""
    users = [await new_user(make_user) for _ in range(3)]
    await public(*users)
    fast = await sockets.open(users[0])
    slow = sockets.make(users[1], app=stall.app())
    assert (await slow.connect(timeout=TIMEOUT))[0]
    other = await sockets.open(users[2])
    opened = [fast, slow, other]
    views = [ClientView(await join(socket)) for socket in opened]
    for socket, view in zip(opened, views, strict=True):
        await view.until(socket, {key(user) for user in users}, 0)
    return users, opened


async def test_a_client_that_reads_nothing_holds_up_no_later_room_diff_of_another_connection(
    sockets: Sockets, make_user: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a server whose send waits, a room_diff to a client that reads nothing waits up to
    SEND_TIMEOUT: the room's later rounds reach the other viewers meanwhile (the round is not
    held until then), and the slow client's own diffs still come in order."""
    monkeypatch.setattr(consumers.sending, "SEND_TIMEOUT", 60.0)  # longer than any wait here
    stall = Stall("room_diff")
    users, (fast, slow, other) = await _room_with_a_slow_reader(sockets, make_user, stall)
    stall.armed.set()
    assert (await join(other, meta={"mode": "one"}))["type"] == "room_state"
    assert (await receive(fast))["joins"][key(users[2])]["meta"] == {"mode": "one"}
    await asyncio.wait_for(stall.held.wait(), TIMEOUT)  # the slow client's send waits
    assert (await join(other, meta={"mode": "two"}))["type"] == "room_state"
    # The next window's round, while the slow client's send is still held.
    assert (await receive(fast))["joins"][key(users[2])]["meta"] == {"mode": "two"}
    assert not stall.drained.is_set()
    stall.drained.set()
    assert (await receive(slow))["joins"][key(users[2])]["meta"] == {"mode": "one"}
    assert (await receive(slow))["joins"][key(users[2])]["meta"] == {"mode": "two"}
    await assert_silent(fast, slow, other)


async def test_a_room_diff_queued_behind_a_held_send_gives_way_to_a_join_again(
    sockets: Sockets, make_user: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A room_diff waiting for the connection's earlier send is looked at again when it goes:
    a join again answered meanwhile (its room_state made from the view, the diff's change in
    it, sent apart from the hub's queue) must not be followed by that older diff."""
    monkeypatch.setattr(consumers.sending, "SEND_TIMEOUT", 60.0)
    stall = Stall("room_diff")
    users, (fast, slow, other) = await _room_with_a_slow_reader(sockets, make_user, stall)
    stall.armed.set()
    assert (await join(other, meta={"mode": "one"}))["type"] == "room_state"
    await asyncio.wait_for(stall.held.wait(), TIMEOUT)
    assert (await join(other, meta={"mode": "two"}))["type"] == "room_state"
    assert (await receive(fast))["joins"][key(users[2])]["meta"] == {"mode": "one"}
    assert (await receive(fast))["joins"][key(users[2])]["meta"] == {"mode": "two"}
    assert (await receive(slow))["joins"][key(users[2])]["meta"] == {"mode": "one"}
    # The slow client joins again: its answer shows "two" (the diff queued behind the held
    # send has been applied to its view).
    again = await join(slow, meta={"mode": "back"})
    assert again["type"] == "room_state"
    assert again["members"][key(users[2])]["meta"] == {"mode": "two"}
    stall.drained.set()
    for socket in (fast, other):
        assert (await receive(socket))["joins"][key(users[1])]["meta"] == {"mode": "back"}
    await assert_silent(slow, fast, other)


async def test_a_client_that_reads_nothing_holds_up_no_refresh_of_the_other_views(
    sockets: Sockets, make_user: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a failed channel-layer call every view is sent a fresh room_state: one to a client
    that reads nothing does not hold the sweep (the others' states, the next sweep) until its
    SEND_TIMEOUT, and what the room's changes bring it next comes after its room_state."""
    monkeypatch.setattr(consumers.sending, "SEND_TIMEOUT", 60.0)
    stall = Stall("room_state")
    users, (fast, slow, other) = await _room_with_a_slow_reader(sockets, make_user, stall)
    hub = Hub.current()
    assert hub is not None
    stall.armed.set()
    announce.note_layer_failure()  # announcements may have been lost: every view refreshed
    await asyncio.wait_for(hub.rooms.sweep(), TIMEOUT)
    assert stall.held.is_set()  # the slow client's room_state was handed over, and is held
    everyone = {key(user) for user in users}
    for socket in (fast, other):
        assert members(await receive(socket)) == everyone
    assert (await join(other, meta={"mode": "one"}))["type"] == "room_state"
    assert (await receive(fast))["joins"][key(users[2])]["meta"] == {"mode": "one"}
    stall.drained.set()
    state = await receive(slow)
    assert state["type"] == "room_state" and members(state) == everyone
    assert (await receive(slow))["joins"][key(users[2])]["meta"] == {"mode": "one"}
    await assert_silent(fast, slow, other)


async def test_quiet_after_everything(sockets: Sockets, make_user: Callable) -> None:
    socket = await sockets.open(await new_user(make_user))
    await join(socket)
    await assert_silent(socket, seconds=QUIET)


async def test_a_token_socket_joins_like_any_other(sockets: Sockets, make_user: Callable) -> None:
    alice, bob = await new_user(make_user), await new_user(make_user)
    await public(alice, bob)
    a = await sockets.open(alice)
    seen = ClientView(await join(a))
    token = await sync_to_async(issue_token)(bob)
    app = AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))
    headers = [(b"host", b"testserver"), (b"authorization", f"Bearer {token}".encode())]
    b = sockets.make(..., headers=headers, app=app)
    assert (await b.connect(timeout=3))[0]
    state = await join(b, meta={"client": "ios"})
    assert state["members"][key(bob)]["meta"] == {"client": "ios"}
    await seen.until(a, {key(alice), key(bob)}, 0)
    await leave(b)
    await assert_silent(b)


async def test_an_unfollow_hides_a_member_at_once(sockets: Sockets, make_user: Callable) -> None:
    viewer, friend = await new_user(make_user), await new_user(make_user)
    await lets_see(friend, viewer)  # contacts privacy: the viewer may see the friend
    v = await sockets.open(viewer)
    f = await sockets.open(friend)
    seen = ClientView(await join(v))
    await join(f)
    await seen.until(v, {key(viewer), key(friend)}, 0)
    await sync_to_async(api.unfollow)(friend, viewer)
    await seen.until(v, {key(viewer)}, 1)  # still here, now hidden: counted in others
    assert seen.count == 2
