"""A room's rule asked again for members already inside (docs/rooms.md, "When access is taken
away"): at least once per HEARTBEAT_INTERVAL by each process, batched, and at once on
``recheck_room``; a member refused leaves at once, is told, and every other view drops them.
And the invisible flag of a join, which must not overwrite a change made while the join was
under way.

Real Redis, real channels_redis layer, WebsocketCommunicator; the periodic check follows the
wall clock, moved with time_machine (never slept past)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async

from presence import api
from presence.domain.rooms import Room
from presence.hub import rooms as hub_rooms
from presence.rooms import writes as events
from presence.rooms.joins import JoinBatches
from presence.rooms.live import ConnectionRooms as RoomFrames
from tests.live.sockets import (
    TIMEOUT,
    Sockets,
    assert_silent,
    error,
    heartbeat,
    new_user,
    receive,
)
from tests.live.sockets import sockets as sockets
from tests.rooms import rules
from tests.rooms.test_sockets import SETTINGS, ClientView, held_cards, join, key, public

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]

CLUB = "club:1"
INTERVAL = 30
RULES = {**SETTINGS, "ROOMS": {**rules.ROOMS, "club": "tests.rooms.rules.revocable"}}


@pytest.fixture(autouse=True)
def _rule_settings(settings: Any) -> Iterator[None]:
    settings.PRESENCE = {**RULES, "HEARTBEAT_INTERVAL": INTERVAL}
    rules.refused.clear()
    rules.asked.clear()
    yield
    rules.refused.clear()
    rules.asked.clear()


def refused_frame(room: str) -> dict[str, Any]:
    return error("forbidden", f"You may no longer be in the room {room}.", room=room)


def refuse(user: Any, room: str = CLUB) -> None:
    rules.refused.add((user.pk, room.split(":", 1)[1]))


async def members_of(sockets: Sockets, make_user: Callable, n: int) -> list[Any]:
    users = [await new_user(make_user) for _ in range(n)]
    await public(*users)
    return users


async def in_club(
    sockets: Sockets, users: list[Any], room: str = CLUB
) -> tuple[list[Any], list[ClientView]]:
    """A socket per user joined ``room`` in turn; the first one's view once every socket's
    lists them all."""
    opened = [await sockets.open(user) for user in users]
    views = []
    for socket in opened:
        views.append(ClientView(await join(socket, room)))
    for socket, view in zip(opened, views, strict=True):
        await view.until(socket, {key(user) for user in users}, 0)
    return opened, views


async def test_a_member_refused_later_is_dropped_within_a_heartbeat_interval(
    sockets: Sockets, make_user: Callable
) -> None:
    alice, bob = await members_of(sockets, make_user, 2)
    (a, b), (seen, _) = await in_club(sockets, [alice, bob])
    start = time.time()
    refuse(bob)
    rules.asked.clear()
    await assert_silent(a, b)  # no check before its time, and no recheck_room called
    assert rules.asked == []
    with time_machine.travel(start + INTERVAL, tick=False):
        assert await receive(b) == refused_frame(CLUB)
        diff = await receive(a)
        assert diff["leaves"] == [key(bob)] and diff["count"] == 1, diff
        seen.apply(diff)
        await assert_silent(a, b)
        # Alice, still allowed, was asked once and is untouched.
        assert sorted(rules.asked) == sorted([(alice.pk, "1"), (bob.pk, "1")])
        assert seen.shows({key(alice)}, 0)
        # Gone at once, not after OFFLINE_GRACE: a fresh read neither lists nor counts him.
        fresh = await sync_to_async(api.room_presence)(CLUB, alice)
        assert set(fresh["members"]) == {key(alice)} and fresh["count"] == 1


async def test_a_clock_stepped_back_does_not_put_off_the_periodic_check(
    sockets: Sockets, make_user: Callable
) -> None:
    # NTP steps the clock an hour back: the pass due within a heartbeat interval is not put
    # off by the hour (taken at once, as the time since the last one cannot be told).
    alice, bob = await members_of(sockets, make_user, 2)
    (a, b), _ = await in_club(sockets, [alice, bob])
    refuse(bob)
    with time_machine.travel(time.time() - 3600, tick=False):
        assert await receive(b) == refused_frame(CLUB)
        diff = await receive(a)
        assert diff["leaves"] == [key(bob)] and diff["count"] == 1, diff


async def test_recheck_room_drops_at_once(sockets: Sockets, make_user: Callable) -> None:
    alice, bob = await members_of(sockets, make_user, 2)
    (a, b), (seen, _) = await in_club(sockets, [alice, bob])
    refuse(bob)
    # From sync code: through the announcer's loop and the channel layer, as from a view.
    await sync_to_async(api.recheck_room)(CLUB)
    assert await receive(b) == refused_frame(CLUB)
    await seen.until(a, {key(alice)}, 0)
    assert seen.count == 1
    await assert_silent(a, b)
    # Joining again asks the rule, which refuses; once allowed again, he may.
    assert (await join(b, CLUB))["code"] == "forbidden"
    rules.refused.clear()
    assert (await join(b, CLUB))["count"] == 2


async def test_recheck_room_asks_only_for_the_users_named(
    sockets: Sockets, make_user: Callable
) -> None:
    alice, bob, carol = await members_of(sockets, make_user, 3)
    (a, b, c), (seen, _, seen_by_carol) = await in_club(sockets, [alice, bob, carol])
    refuse(bob)
    refuse(carol)
    rules.asked.clear()
    await api.arecheck_room(CLUB, users=[bob])
    assert await receive(b) == refused_frame(CLUB)
    await seen.until(a, {key(alice), key(carol)}, 0)
    await seen_by_carol.until(c, {key(alice), key(carol)}, 0)
    await assert_silent(a, c)
    assert rules.asked == [(bob.pk, "1")]
    # None: every member here (Bob is no longer one).
    rules.asked.clear()
    await api.arecheck_room(("club", 1))
    assert await receive(c) == refused_frame(CLUB)
    await seen.until(a, {key(alice)}, 0)
    assert sorted(rules.asked) == sorted([(alice.pk, "1"), (carol.pk, "1")])
    await assert_silent(a, b)


async def test_recheck_room_refuses_bad_names(sockets: Sockets, make_user: Callable) -> None:
    with pytest.raises(api.InvalidInput):
        await api.arecheck_room("club")
    with pytest.raises(api.UnknownRoom):
        await sync_to_async(api.recheck_room)("nope:1")


async def test_a_join_again_the_rule_refuses_takes_the_connection_out(
    sockets: Sockets, make_user: Callable
) -> None:
    # A join again (a meta change, as the recipes do) asks the rule, as every join does: a
    # refusal takes the connection out of the room, as the rule's later passes do.
    alice, bob, carol = await members_of(sockets, make_user, 3)
    (a, b), (seen, _) = await in_club(sockets, [alice, bob])
    refuse(bob)
    answer = await join(b, CLUB, meta={"mode": "editing"})
    assert (answer["type"], answer["code"], answer["room"]) == ("error", "forbidden", CLUB)
    await seen.until(a, {key(alice)}, 0)
    assert seen.count == 1
    # Out of the room: Carol's join is not told to him, and nobody lists or counts him.
    c = await sockets.open(carol)
    await join(c, CLUB)
    await seen.until(a, {key(alice), key(carol)}, 0)
    await assert_silent(b)
    fresh = await api.aroom_presence(CLUB, alice)
    assert set(fresh["members"]) == {key(alice), key(carol)} and fresh["count"] == 2
    # Allowed again, he joins as anyone does.
    rules.refused.clear()
    assert (await join(b, CLUB))["count"] == 3


async def test_a_room_diff_under_way_is_not_sent_after_a_refusal(
    sockets: Sockets, make_user: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob, carol = await members_of(sockets, make_user, 3)
    (a, b, c), _ = await in_club(sockets, [alice, bob, carol])
    reached, let_go = held_cards(monkeypatch, hub_rooms)
    # Carol's meta changes: the room's delivery to Alice's and Bob's views begins...
    assert (await join(c, CLUB, meta={"mode": "editing"}))["type"] == "room_state"
    await asyncio.wait_for(reached.wait(), TIMEOUT)
    # ...and Bob is refused before it is sent: "no more frames of the room" from then on.
    refuse(bob)
    await api.arecheck_room(CLUB, users=[bob])
    assert await receive(b) == refused_frame(CLUB)
    let_go.set()
    assert (await receive(a))["joins"][key(carol)]["meta"] == {"mode": "editing"}
    await assert_silent(b)


async def test_the_refused_socket_stays_open_in_its_other_rooms(
    sockets: Sockets, make_user: Callable
) -> None:
    alice, bob, carol = await members_of(sockets, make_user, 3)
    (a, b), (seen, _) = await in_club(sockets, [alice, bob])
    a2 = await sockets.open(alice)  # Alice's view of club:2
    seen_elsewhere = ClientView(await join(a2, "club:2"))
    await join(b, "club:2")  # Bob's one socket is in both rooms
    await seen_elsewhere.until(a2, {key(alice), key(bob)}, 0)
    refuse(bob)
    await api.arecheck_room(CLUB)
    assert await receive(b) == refused_frame(CLUB)
    await seen.until(a, {key(alice)}, 0)
    await assert_silent(a2, b)
    # Still in club:2, on the same socket: Carol's join there reaches him.
    c = await sockets.open(carol)
    await join(c, "club:2")
    bobs_view = await receive(b)
    assert bobs_view["type"] == "room_diff" and bobs_view["room"] == "club:2"
    assert set(bobs_view["joins"]) == {key(carol)}
    # His heartbeats renew club:2 only: club:1 does not take him back.
    with time_machine.travel(time.time() + INTERVAL / 2 + 1, tick=False):
        await heartbeat(b)
        club = await sync_to_async(api.room_presence)(CLUB, alice)
        other = await sync_to_async(api.room_presence)("club:2", alice)
    assert club["count"] == 1 and other["count"] == 3


async def test_the_rule_is_asked_once_per_user_and_room_per_pass(
    sockets: Sockets, make_user: Callable
) -> None:
    alice, bob, carol = await members_of(sockets, make_user, 3)
    (a, b), _ = await in_club(sockets, [alice, bob])
    again = await sockets.open(alice)  # a second socket of Alice's in the room
    await join(again, CLUB)
    await join(b, "club:2")
    c = await sockets.open(carol)
    await join(c, "club:3")
    start = time.time()
    refuse(carol, "club:3")  # the pass's end shows: her error
    rules.asked.clear()
    with time_machine.travel(start + INTERVAL, tick=False):
        assert await receive(c) == refused_frame("club:3")
    assert sorted(map(str, rules.asked)) == sorted(
        map(str, [(alice.pk, "1"), (bob.pk, "1"), (bob.pk, "2"), (carol.pk, "3")])
    )
    await assert_silent(a, again, b)


async def test_going_invisible_during_a_join_is_neither_listed_nor_counted(
    sockets: Sockets, make_user: Callable, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The join reads the joiner's own facts (visible), then they go invisible before the join
    is written: the room's flag must end invisible. A read counts its first candidates by their
    facts, but the members after them by the room's flag only: a stale flag is counted."""
    settings.PRESENCE = {**RULES, "ROOM_LIST_LIMIT": 1}  # the first 2 members are read
    viewer, early, later, joiner, reader = await members_of(sockets, make_user, 5)
    room = Room("post", "1")
    v = await sockets.open(viewer)
    await join(v, room.name)  # this process is in the rooms' groups: the change reaches it
    for user in (early, later):
        await events.ajoin_room(user, f"c{user.pk}", room, None, False)
    called, done = asyncio.Event(), asyncio.Event()
    recheck = RoomFrames.recheck_rooms

    async def watched_recheck(self: Any) -> None:
        mine = self.viewer_id == joiner.pk
        if mine:
            called.set()
        await recheck(self)
        if mine:
            done.set()

    entry = JoinBatches.entry

    async def entry_then_invisible(self: Any, user: Any, where: Any, own: bool = False) -> Any:
        found = await entry(self, user, where, own)
        if user.pk == joiner.pk:
            await sync_to_async(api.set_status)(joiner, "invisible")
            await asyncio.wait_for(called.wait(), TIMEOUT)  # the change reached the socket
        return found

    monkeypatch.setattr(RoomFrames, "recheck_rooms", watched_recheck)
    monkeypatch.setattr(JoinBatches, "entry", entry_then_invisible)
    j = await sockets.open(joiner)
    assert (await join(j, room.name))["type"] == "room_state"
    await asyncio.wait_for(done.wait(), TIMEOUT)
    fresh = await sync_to_async(api.room_presence)(room.name, reader)
    assert key(joiner) not in fresh["members"]
    assert fresh["count"] == 3, fresh  # the viewer, early and later; not the joiner
