"""How long a member stays: closed sockets (OFFLINE_GRACE), reloads within the grace, crashed
connections (CONNECTION_TTL), several connections, a burst of joins coalesced, presence_cleanup.

Time is moved with time_machine; rooms are swept by calling the hubs' sweep."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async

from presence import announce, api
from presence.conf import get_settings
from presence.domain.rooms import Room
from presence.hub import Hub
from presence.models import PrivacySettings
from presence.rooms import live
from presence.rooms import writes as events
from presence.store import get_store
from tests.live.sockets import (
    TIMEOUT,
    Sockets,
    announced_about,
    assert_silent,
    heartbeat,
    new_user,
    receive,
)
from tests.live.sockets import sockets as sockets
from tests.rooms.members import no_room_key_left_once_leaves_are_past
from tests.rooms.test_sockets import SETTINGS, ClientView, join, key, leave, public

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]

ROOM = "post:1"


@pytest.fixture(autouse=True)
def _room_settings(settings: Any) -> None:
    settings.PRESENCE = dict(SETTINGS)


async def two_in_a_room(sockets: Sockets, make_user: Callable) -> tuple[Any, ...]:
    alice, bob = await new_user(make_user), await new_user(make_user)
    await public(alice, bob)
    a = await sockets.open(alice)
    b = await sockets.open(bob)
    seen = ClientView(await join(a))
    await join(b)
    await seen.until(a, {key(alice), key(bob)}, 0)
    return alice, bob, a, b, seen


async def test_a_closed_socket_leaves_after_the_grace(
    sockets: Sockets, make_user: Callable
) -> None:
    alice, bob, a, b, seen = await two_in_a_room(sockets, make_user)
    await sockets.close(b)
    closed = time.time()
    assert await events.asweep_rooms() == {}
    await assert_silent(a)
    # Never earlier than the grace after the close (it counts from the end of its second).
    with time_machine.travel(closed + SETTINGS["OFFLINE_GRACE"] - 0.1, tick=False):
        assert await events.asweep_rooms() == {}
    with time_machine.travel(closed + 2 + SETTINGS["OFFLINE_GRACE"], tick=False):
        assert await events.asweep_rooms() == {ROOM: [bob.pk]}
        await seen.until(a, {key(alice)}, 0)
    assert seen.count == 1


async def test_a_reload_within_the_grace_is_no_leave(sockets: Sockets, make_user: Callable) -> None:
    _, bob, a, b, seen = await two_in_a_room(sockets, make_user)
    await sockets.close(b)
    closed = time.time()
    again = await sockets.open(bob)
    assert (await join(again))["count"] == 2
    with time_machine.travel(closed + 30, tick=False):
        assert await events.asweep_rooms() == {}
    await assert_silent(a)
    assert seen.count == 2


async def test_a_member_with_two_connections_stays_while_one_is_open(
    sockets: Sockets, make_user: Callable
) -> None:
    _, bob, a, b, _ = await two_in_a_room(sockets, make_user)
    other = await sockets.open(bob)
    await join(other)
    await sockets.close(b)
    with time_machine.travel(time.time() + 30, tick=False):
        assert await events.asweep_rooms() == {}
    await assert_silent(a)


@sync_to_async
def contacts_only(user: Any) -> None:
    settings = PrivacySettings.objects.get(user=user)
    settings.online_visibility = "contacts"
    settings.save()


async def test_a_leave_during_a_renewal_of_its_rooms_is_not_undone(
    sockets: Sockets, make_user: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bob's two sockets rewrite their rooms' flags (he changed his privacy) when one of them
    # leaves: the leave is written after that socket's renewal, which must not keep it in the
    # room its full CONNECTION_TTL; once the other leaves, Bob is gone after OFFLINE_GRACE.
    alice, bob, _, b, _ = await two_in_a_room(sockets, make_user)
    b2 = await sockets.open(bob)
    await join(b2)
    held, leaving = [], asyncio.Event()
    renewing = asyncio.Event()
    real_renew, real_leave = live.arenew_rooms, live.ConnectionRooms.leave

    async def held_renewal(user: Any, *args: Any, **kwargs: Any) -> None:
        if user.pk == bob.pk:
            held.append(user)
            if len(held) == 2:  # both sockets' renewals are under way
                renewing.set()
            await asyncio.wait_for(leaving.wait(), TIMEOUT)  # a busy Redis, say
        await real_renew(user, *args, **kwargs)

    async def noted_leave(self: live.ConnectionRooms, room: Room) -> None:
        leaving.set()
        await real_leave(self, room)

    monkeypatch.setattr(live, "arenew_rooms", held_renewal)
    monkeypatch.setattr(live.ConnectionRooms, "leave", noted_leave)
    await contacts_only(bob)  # announced: each of his sockets rewrites its rooms' flags
    await asyncio.wait_for(renewing.wait(), TIMEOUT)
    await leave(b)
    assert (await join(b, "post:2"))["type"] == "room_state"  # (the leave was handled)
    await leave(b2)
    assert (await join(b2, "post:2"))["type"] == "room_state"
    left = time.time()
    with time_machine.travel(left + 2 + get_settings().OFFLINE_GRACE, tick=False):
        assert await events.asweep_rooms() == {ROOM: [bob.pk]}
        assert (await api.aroom_presence(ROOM, alice))["count"] == 1


async def test_a_crashed_connection_leaves_after_the_ttl(
    sockets: Sockets, make_user: Callable
) -> None:
    alice, bob, a, b, seen = await two_in_a_room(sockets, make_user)
    start = time.time()
    # Alice's client beats; Bob's stopped (its process, or its network, died).
    with time_machine.travel(start + 60, tick=False):
        await heartbeat(a)
    with time_machine.travel(start + 1 + SETTINGS["CONNECTION_TTL"] + 2, tick=False):
        assert await events.asweep_rooms() == {ROOM: [bob.pk]}
        await seen.until(a, {key(alice)}, 0)
    # A heartbeat after that joins Bob again (his connection was alive after all).
    with time_machine.travel(start + 1 + SETTINGS["CONNECTION_TTL"] + 5, tick=False):
        await b.send_json_to({"type": "heartbeat", "state": "active"})
        await seen.until(a, {key(alice), key(bob)}, 0)


async def test_a_member_gone_invisible_in_the_grace_counts_the_same_everywhere(
    sockets: Sockets, make_user: Callable
) -> None:
    """A member whose last socket closed goes invisible (another device, over HTTP): no
    connection of theirs rewrites their rooms' flags, so the room keeps them visible until
    their stay ends. Every count follows the room's flags alike (room_counts, room_presence,
    the live view): they are counted, never listed."""
    alice, bob, a, b, seen = await two_in_a_room(sockets, make_user)
    await sockets.close(b)
    await api.aset_status(bob, "invisible")
    while key(bob) in seen.members:
        seen.apply(await receive(a))
    await assert_silent(a)
    shown = await api.aroom_presence(ROOM, alice)
    assert set(shown["members"]) == {key(alice)}
    counts = await api.aroom_counts([ROOM], alice)
    assert counts[ROOM] == shown["count"] == seen.count == 2


def stamp_deliveries(monkeypatch: pytest.MonkeyPatch, room: str) -> list[float]:
    """The loop times at which the hub begins each delivery of ``room`` from now on."""
    hub = Hub.current()
    assert hub is not None
    stamps: list[float] = []
    deliver = hub.rooms.deliver

    async def stamped(delivered: str, user_ids: Any) -> None:
        if delivered == room:
            stamps.append(asyncio.get_running_loop().time())
        await deliver(delivered, user_ids)

    monkeypatch.setattr(hub.rooms, "deliver", stamped)
    return stamps


async def test_a_burst_of_joins_is_a_handful_of_frames(
    sockets: Sockets, make_user: Callable, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.PRESENCE = {**SETTINGS, "COALESCE_WINDOW": 0.3, "ROOM_LIST_LIMIT": 20}
    viewer = await new_user(make_user)
    joiners = [await new_user(make_user) for _ in range(60)]
    await public(*joiners[:30])  # the others are hidden from the viewer
    v = await sockets.open(viewer)
    seen = ClientView(await join(v))
    # Every delivery from now on (one in flight when the burst begins may carry its first
    # joins too).
    delivered = stamp_deliveries(monkeypatch, ROOM)
    for user in joiners:
        await sync_to_async(api.touch)(user)
    await assert_silent(v)
    for user in joiners:
        await events.ajoin_room(user, "c", Room("post", "1"), None, False)
    while seen.count < 61:
        seen.apply(await receive(v))
    # A frame per delivery at most, and a delivery per window at most, whenever the
    # announcements arrive (a busy machine's channel layer hands them over late: each would
    # otherwise be delivered at once, a frame per join). The due check allows 5 ms early.
    assert 1 <= seen.frames <= len(delivered), (seen.frames, delivered)
    gaps = [later - earlier for earlier, later in itertools.pairwise(delivered)]
    assert all(gap >= 0.3 - 0.005 for gap in gaps), gaps
    assert seen.frames < len(joiners) // 2, seen.frames
    assert len(seen.members) == 20 and seen.others == 41
    assert key(viewer) in seen.members
    listed = set(seen.members) - {key(viewer)}
    assert listed <= {key(user) for user in joiners[:30]}


async def test_cleanup_leaves_no_room_key_behind(
    sockets: Sockets, make_user: Callable, redis_client: Any
) -> None:
    alice = await new_user(make_user)
    store = get_store()
    then = time.time() - 3600
    await store.arun(store.plans.join_room(ROOM, alice.pk, "c", then, '{"m":1}', True))
    await store.arun(store.plans.join_room("group:2", alice.pk, "c", then))
    await store.arun(store.plans.leave_room("group:2", alice.pk, "c", then + 1))
    report = await sync_to_async(api.cleanup)()
    assert report.room_members == 2
    assert await sync_to_async(no_room_key_left_once_leaves_are_past)(redis_client)


async def test_after_a_layer_failure_every_view_gets_a_fresh_state(
    sockets: Sockets, make_user: Callable
) -> None:
    """Announcements may have been lost while the channel layer failed: the hub's sweep sends
    each view here a fresh room_state, which replaces what the client shows."""
    alice, bob, a, b, _ = await two_in_a_room(sockets, make_user)
    carol = await new_user(make_user)
    await public(carol)
    await sync_to_async(api.touch)(carol)
    await assert_silent(a, b)  # her privacy change reached the rooms: nothing to show yet
    # Carol's join is recorded, but its announcement lost (as if the layer were down).
    store = get_store()
    await store.arun(store.plans.join_room(ROOM, carol.pk, "c", time.time()))
    await assert_silent(a, b)
    hub = Hub.current()
    assert hub is not None
    announce.note_layer_failure()
    await hub.rooms.sweep()
    fresh = await receive(a)
    everyone = {key(alice), key(bob), key(carol)}
    assert fresh["type"] == "room_state" and set(fresh["members"]) == everyone
    again = await receive(b)
    assert again["type"] == "room_state" and again["count"] == 3
    await hub.rooms.sweep()  # once per failure
    await assert_silent(a, b)


async def test_a_process_caught_up_with_its_channel_sends_every_view_a_fresh_state(
    sockets: Sockets, make_user: Callable, settings: Any, clock: time_machine.Coordinates
) -> None:
    """A process behind its channel may have lost room announcements (past the layer's
    expiry they are dropped): once it has caught up, each room view here gets a fresh
    room_state, as its watched users are resolved again; once per catch-up."""
    settings.PRESENCE = {**SETTINGS, "SWEEP_INTERVAL": 0.1}
    alice, bob, a, b, _ = await two_in_a_room(sockets, make_user)
    carol = await new_user(make_user)
    await public(carol)
    await sync_to_async(api.touch)(carol)
    await assert_silent(a, b)
    store = get_store()
    await store.arun(store.plans.join_room(ROOM, carol.pk, "c", time.time()))  # not announced
    hub = Hub.current()
    assert hub is not None
    # An announcement about someone else arrives as late as that: the process is behind.
    announced_about(hub, await new_user(make_user), time.time() - hub.behind_after())
    assert hub.recovery.behind
    fresh = await receive(a)
    assert fresh["type"] == "room_state"
    assert set(fresh["members"]) == {key(alice), key(bob), key(carol)}
    assert (await receive(b))["count"] == 3
    assert not hub.recovery.behind
    await assert_silent(a, b)
