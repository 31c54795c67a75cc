"""watch_room_count / unwatch_room_count: a room's count, live, for a connection that does not
join it (an index page's "3 here"; docs/websocket.md, docs/rooms.md). Real Redis, the real
channel layer, WebsocketCommunicator; "nothing sent" is asserted over a quiet time several
coalescing windows long (tests/live/sockets.py's assert_silent), as the room tests do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from presence import signals
from presence.hub import Hub
from presence.models import Block, PrivacySettings
from presence.rooms import writes
from tests.live.sockets import Sockets, assert_silent, new_user, receive
from tests.live.sockets import sockets as sockets
from tests.rooms import rules
from tests.rooms.rules import ROOMS
from tests.rooms.test_sockets import SETTINGS, join, key, leave, public

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]

ROOM = "post:1"
REVOCABLE = {**ROOMS, "club": "tests.rooms.rules.revocable"}


@pytest.fixture(autouse=True)
def _room_settings(settings: Any) -> None:
    settings.PRESENCE = {**SETTINGS, "ROOMS": REVOCABLE}


@pytest.fixture
def entered() -> Iterator[list[tuple[Any, str]]]:
    """The room_entered signals sent in this test: (user id, room)."""
    got: list[tuple[Any, str]] = []

    def receiver(sender: Any, user_id: Any, room: str, at: Any, **kwargs: Any) -> None:
        got.append((user_id, room))

    signals.room_entered.connect(receiver)
    yield got
    signals.wait_sent()
    signals.room_entered.disconnect(receiver)


async def watch(communicator: WebsocketCommunicator, room: str = ROOM) -> dict[str, Any]:
    await communicator.send_json_to({"type": "watch_room_count", "room": room})
    return await receive(communicator)


async def unwatch(communicator: WebsocketCommunicator, room: str = ROOM) -> None:
    await communicator.send_json_to({"type": "unwatch_room_count", "room": room})


def count(n: int, room: str = ROOM) -> dict[str, Any]:
    return {"type": "room_count", "room": room, "count": n}


def room_diff(room: str = ROOM, *, count: int, others: int) -> dict[str, Any]:
    """A room_diff that lists nobody new and nobody gone (the members are strangers: counted
    in ``others``)."""
    return {
        "type": "room_diff",
        "room": room,
        "joins": {},
        "leaves": [],
        "others": others,
        "count": count,
    }


async def past_the_grace() -> None:
    """The members who left are out once OFFLINE_GRACE passed: the rooms swept then (the clock
    moved, never slept past)."""
    with time_machine.travel(time.time() + 2 + SETTINGS["OFFLINE_GRACE"], tick=False):
        await writes.asweep_rooms()


def refusal(frame: dict[str, Any]) -> tuple[str, str, str | None]:
    return frame["type"], frame["code"], frame.get("room")


async def test_a_watcher_is_answered_at_once_then_told_of_joins_and_leaves(
    sockets: Sockets, make_user: Callable, entered: list[tuple[Any, str]]
) -> None:
    viewer, alice, bob = [await new_user(make_user) for _ in range(3)]
    w = await sockets.open(viewer)
    assert await watch(w) == count(0)
    a = await sockets.open(alice)
    state = await join(a)
    # The watcher is neither listed nor counted, and entered no room.
    assert set(state["members"]) == {key(alice)} and state["count"] == 1
    assert await receive(w) == count(1)
    b = await sockets.open(bob)
    await join(b)
    assert await receive(w) == count(2)
    await leave(b)
    await join(b, "post:2")  # (the leave was handled)
    await past_the_grace()
    assert await receive(w) == count(1)
    await assert_silent(w)
    await sync_to_async(signals.wait_sent)()
    assert [uid for uid, room in entered if room == ROOM] == [alice.pk, bob.pk]
    assert not any(uid == viewer.pk for uid, _ in entered)


async def test_a_blocked_or_invisible_members_coming_and_going_sends_nothing(
    sockets: Sockets, make_user: Callable
) -> None:
    viewer, blocker, invisible, other = [await new_user(make_user) for _ in range(4)]
    await sync_to_async(Block.objects.create)(blocker=blocker, blocked=viewer)
    await sync_to_async(PrivacySettings.objects.create)(user=invisible, invisible=True)
    w = await sockets.open(viewer)
    assert await watch(w) == count(0)
    blocking = await sockets.open(blocker)
    hidden = await sockets.open(invisible)
    assert (await join(blocking))["type"] == "room_state"
    assert (await join(hidden))["type"] == "room_state"
    await assert_silent(w)  # not even a frame repeating 0
    await leave(blocking)
    await leave(hidden)
    await join(blocking, "post:2")
    await join(hidden, "post:2")
    await past_the_grace()
    await assert_silent(w)
    # Members it may count reach it.
    o = await sockets.open(other)
    await join(o)
    assert await receive(w) == count(1)
    await assert_silent(w)


async def test_a_privacy_change_that_changes_the_viewers_count_sends_it(
    sockets: Sockets, make_user: Callable
) -> None:
    viewer, alice = await new_user(make_user), await new_user(make_user)
    await public(alice)
    w = await sockets.open(viewer)
    a = await sockets.open(alice)
    await join(a)
    assert await watch(w) == count(1)
    await sync_to_async(Block.objects.create)(blocker=viewer, blocked=alice)
    assert await receive(w) == count(0)
    await sync_to_async(Block.objects.filter(blocker=viewer).delete)()
    assert await receive(w) == count(1)
    # Going invisible leaves the count; back, it counts again.
    await a.send_json_to({"type": "set_status", "status": "invisible"})
    assert (await receive(a))["type"] == "status"
    assert await receive(w) == count(0)
    await a.send_json_to({"type": "set_status", "status": "auto"})
    await receive(a)
    assert await receive(w) == count(1)
    await assert_silent(w)


async def test_the_rooms_rule_and_kind_are_asked_as_for_a_join(
    sockets: Sockets, make_user: Callable
) -> None:
    w = await sockets.open(await new_user(make_user))
    assert refusal(await watch(w, "group:3")) == ("error", "forbidden", "group:3")
    assert refusal(await watch(w, "nope:1")) == ("error", "unknown_room", "nope:1")
    assert refusal(await watch(w, "post:a b")) == ("error", "invalid_value", "post:a b")
    await w.send_json_to({"type": "watch_room_count"})
    assert (await receive(w))["code"] == "invalid_message"
    await assert_silent(w)
    hub = Hub.current()
    assert hub is not None and hub.registry.room_counts.members == {}
    assert await watch(w, "group:2") == count(0, "group:2")


async def test_a_watcher_the_rule_no_longer_lets_in_stops_watching(
    sockets: Sockets, make_user: Callable
) -> None:
    from presence import api

    viewer, alice = await new_user(make_user), await new_user(make_user)
    w = await sockets.open(viewer)
    assert await watch(w, "club:1") == count(0, "club:1")
    try:
        rules.refused.add((viewer.pk, "1"))
        await api.arecheck_room("club:1")
        assert refusal(await receive(w)) == ("error", "forbidden", "club:1")
    finally:
        rules.refused.clear()
        rules.asked.clear()
    a = await sockets.open(alice)
    await join(a, "club:1")
    await assert_silent(w)


async def test_watched_rooms_are_bounded_apart_from_max_rooms(
    sockets: Sockets, make_user: Callable, settings: Any
) -> None:
    settings.PRESENCE = {**SETTINGS, "ROOMS": REVOCABLE, "MAX_WATCHED_ROOMS": 2, "MAX_ROOMS": 1}
    w = await sockets.open(await new_user(make_user))
    assert await watch(w, "post:1") == count(0, "post:1")
    assert await watch(w, "post:2") == count(0, "post:2")
    reply = await watch(w, "post:3")
    assert refusal(reply) == ("error", "too_many_watched_rooms", "post:3")
    assert "at most 2 rooms" in reply["message"]
    # Watching a room watched already is no new one; an unwatch makes room.
    assert await watch(w, "post:2") == count(0, "post:2")
    await unwatch(w, "post:1")
    assert await watch(w, "post:3") == count(0, "post:3")
    # Watching takes no place of MAX_ROOMS, and a room watched may be joined too.
    state = await join(w, "post:2")
    assert state["type"] == "room_state" and state["count"] == 1
    assert await receive(w) == count(1, "post:2")  # both frames: it counts itself
    await assert_silent(w)


async def test_unwatch_stops_the_frames_and_leaves_nothing_behind(
    sockets: Sockets, make_user: Callable
) -> None:
    viewer, alice = await new_user(make_user), await new_user(make_user)
    w = await sockets.open(viewer)
    assert await watch(w) == count(0)
    await unwatch(w)
    await unwatch(w)  # not watched: nothing
    a = await sockets.open(alice)
    await join(a)
    await assert_silent(w)
    hub = Hub.current()
    assert hub is not None
    assert hub.registry.room_counts.members == {} and hub.rooms.counts.sent == {}
    # Watched again: the count now.
    assert await watch(w) == count(1)


async def test_a_member_leaving_keeps_the_rooms_group_for_its_watchers(
    sockets: Sockets, make_user: Callable
) -> None:
    """A room both joined and watched on one process is one group: the last member leaving
    must not take the watchers' announcements away, nor the last watcher the members'."""
    viewer, alice, bob = [await new_user(make_user) for _ in range(3)]
    w = await sockets.open(viewer)
    a = await sockets.open(alice)
    await join(a)
    assert await watch(w) == count(1)
    await leave(a)
    await join(a, "post:2")
    await past_the_grace()
    assert await receive(w) == count(0)
    b = await sockets.open(bob)
    await join(b)
    assert await receive(w) == count(1)
    await unwatch(w)
    seen = await join(a)
    assert seen["count"] == 2
    # b is told of a's join before it leaves: taken for the answer to its next join, this
    # diff let the sweep run before b's leave was written (nobody removed, no diff of it).
    assert await receive(b) == room_diff(count=2, others=1)
    await leave(b)
    assert (await join(b, "post:2"))["type"] == "room_state"  # (the leave was handled)
    await past_the_grace()
    # a is in both rooms, whose ticks and order are their own: b's leave, b's join of post:2.
    diffs = {frame["room"]: frame for frame in [await receive(a), await receive(a)]}
    assert diffs == {
        ROOM: room_diff(count=1, others=0),
        "post:2": room_diff("post:2", count=2, others=1),
    }
    await assert_silent(w, a)
