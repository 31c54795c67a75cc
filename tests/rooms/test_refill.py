"""A full list follows a fresh read: when a listed member leaves a viewer's full list
(``others`` > 0), the same window's room_diff lists the next member as a fresh read would; a
contact of the viewer joining a full list takes its last place at once (not only at the next
room_state) (real Redis, real channel layer, WebsocketCommunicator; time moved with
time_machine, rooms swept by calling the sweep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async

from presence import api
from presence.models import Contact
from presence.rooms import writes as events
from tests.live.sockets import Sockets, assert_silent, new_user, receive
from tests.live.sockets import sockets as sockets
from tests.rooms.test_sockets import SETTINGS, ClientView, join, key, public

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
    settings.PRESENCE = {**SETTINGS, "ROOM_LIST_LIMIT": 3}


async def open_in_order(
    sockets: Sockets, viewer: Any, members: list[Any]
) -> tuple[dict[Any, Any], Any, ClientView]:
    """``members`` join in this order, then the viewer: their sockets, the viewer's and its
    view from its room_state."""
    opened = {}
    for user in members:
        opened[user] = await sockets.open(user)
        await join(opened[user])
    v = await sockets.open(viewer)
    return opened, v, ClientView(await join(v))


async def swept_after_leaving(sockets: Sockets, socket: Any, user: Any, v: Any) -> Any:
    """``user`` closes ``socket``; once the grace has passed the sweep removes them: the
    viewer's next frame."""
    await sockets.close(socket)
    closed = time.time()
    with time_machine.travel(closed + 2 + SETTINGS["OFFLINE_GRACE"], tick=False):
        assert await events.asweep_rooms() == {ROOM: [user.pk]}
        return await receive(v)


async def test_a_freed_place_is_refilled_in_the_same_diff(
    sockets: Sockets, make_user: Callable
) -> None:
    viewer = await new_user(make_user)
    first, second, hidden, fourth, fifth = [await new_user(make_user) for _ in range(5)]
    # ``hidden`` keeps the default visibility: the viewer may not see it (counted in others).
    await public(viewer, first, second, fourth, fifth)
    opened, v, seen = await open_in_order(sockets, viewer, [first, second, hidden, fourth, fifth])
    # Full: the viewer, then by join time; ``hidden`` and ``fifth`` are others.
    assert seen.shows({key(viewer), key(first), key(second)}, 3), seen.members
    await assert_silent(v)

    frame = await swept_after_leaving(sockets, opened[first], first, v)
    # One diff: the leave and the next member the viewer may see (``fourth``, not ``hidden``).
    assert frame["leaves"] == [key(first)]
    assert set(frame["joins"]) == {key(fourth)}
    assert (frame["others"], frame["count"]) == (2, 5)
    seen.apply(frame)
    fresh = await api.aroom_presence(ROOM, viewer)
    assert set(seen.members) == set(fresh["members"])
    assert (seen.others, seen.count) == (fresh["others"], fresh["count"])
    await assert_silent(v)


async def test_no_refill_from_members_the_viewer_may_not_see(
    sockets: Sockets, make_user: Callable
) -> None:
    viewer = await new_user(make_user)
    first, second, hidden = [await new_user(make_user) for _ in range(3)]
    await public(viewer, first, second)
    opened, v, seen = await open_in_order(sockets, viewer, [first, second, hidden])
    assert seen.shows({key(viewer), key(first), key(second)}, 1), seen.members
    await assert_silent(v)

    frame = await swept_after_leaving(sockets, opened[first], first, v)
    assert frame["leaves"] == [key(first)] and frame["joins"] == {}
    assert (frame["others"], frame["count"]) == (1, 3)
    seen.apply(frame)
    fresh = await api.aroom_presence(ROOM, viewer)
    assert set(seen.members) == set(fresh["members"]) == {key(viewer), key(second)}


async def test_a_contact_joining_a_full_list_takes_the_last_place(
    sockets: Sockets, make_user: Callable
) -> None:
    """The viewer's contacts are listed first: one joining a full list is listed at once, in
    the place of the list's last member by join time (counted in others from then on)."""
    viewer, friend = await new_user(make_user), await new_user(make_user)
    first, second, third = [await new_user(make_user) for _ in range(3)]
    await public(viewer, friend, first, second, third)
    await sync_to_async(Contact.objects.create)(owner=viewer, contact=friend)
    _, v, seen = await open_in_order(sockets, viewer, [first, second, third])
    assert seen.shows({key(viewer), key(first), key(second)}, 1), seen.members
    await assert_silent(v)

    await join(await sockets.open(friend))
    frame = await receive(v)
    assert set(frame["joins"]) == {key(friend)} and frame["leaves"] == [key(second)], frame
    assert (frame["others"], frame["count"]) == (2, 5)
    seen.apply(frame)
    fresh = await api.aroom_presence(ROOM, viewer)
    assert set(seen.members) == set(fresh["members"]) == {key(viewer), key(friend), key(first)}
    assert (seen.others, seen.count) == (fresh["others"], fresh["count"])
    # A member who is no contact joining the full list is counted only.
    await join(await sockets.open(await new_user(make_user)))
    counted = await receive(v)
    assert counted["joins"] == {} and counted["leaves"] == [] and counted["count"] == 6
    await assert_silent(v)


async def test_a_member_who_becomes_visible_takes_its_place_in_a_full_list(
    sockets: Sockets, make_user: Callable
) -> None:
    """A member who joined before the list's last member and just became visible to the
    viewer is listed at once, in that member's place (who counts in others from then on), as
    a fresh read lists them: not only at the next room_state. The count does not change."""
    viewer = await new_user(make_user)
    first, hidden, second, third, late = [await new_user(make_user) for _ in range(5)]
    await public(viewer, first, second, third)
    # ``hidden`` and ``late`` keep the default visibility: the viewer may not see them.
    _, v, seen = await open_in_order(sockets, viewer, [first, hidden, second, third, late])
    assert seen.shows({key(viewer), key(first), key(second)}, 3), seen.members
    await assert_silent(v)

    await public(hidden)
    frame = await receive(v)
    assert set(frame["joins"]) == {key(hidden)} and frame["leaves"] == [key(second)], frame
    assert (frame["others"], frame["count"]) == (3, 6)
    seen.apply(frame)
    fresh = await api.aroom_presence(ROOM, viewer)
    assert set(seen.members) == set(fresh["members"]) == {key(viewer), key(first), key(hidden)}
    assert (seen.others, seen.count) == (fresh["others"], fresh["count"])
    await assert_silent(v)

    # One who joined after every listed member becoming visible is counted already, and a
    # fresh read does not list it: no frame.
    await public(late)
    await assert_silent(v)
    fresh = await api.aroom_presence(ROOM, viewer)
    assert set(seen.members) == set(fresh["members"])
    assert (seen.others, seen.count) == (fresh["others"], fresh["count"])
