"""A relation change (a follow, an unfollow, a block lifted) reaches the full lists of the rooms
it reorders at once, as a fresh read lists them: the viewer's contacts come first, so a viewer
following a member present changes the viewer's own list, not only what the member's other
viewers see of the viewer (real Redis, real channel layer, WebsocketCommunicator; the changes
made through presence's API, as a site's views and the load test's harness make them, so the
receivers' announcements run).

The load test's final check once found a viewer of a big room whose full list kept a member
listed where a fresh read listed the member the viewer had followed 148 s before: the follow
was announced to the rooms as a change of the follower only, and no view looked at the member
followed again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from presence import api
from tests.live.sockets import Sockets, assert_silent, new_user, receive
from tests.live.sockets import sockets as sockets
from tests.rooms.test_refill import open_in_order
from tests.rooms.test_sockets import SETTINGS, ClientView, key, public

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


async def agrees_with_a_fresh_read(seen: ClientView, viewer: Any) -> None:
    fresh = await api.aroom_presence(ROOM, viewer)
    assert set(seen.members) == set(fresh["members"]), (seen.members, fresh["members"])
    assert (seen.others, seen.count) == (fresh["others"], fresh["count"])


async def swapped_in(
    v: Any, seen: ClientView, viewer: Any, joins: Any, leaves: Any, others: int, count: int
) -> None:
    """The viewer's next frame lists ``joins`` in the place of ``leaves`` (``others`` and
    ``count`` after it), and the view then agrees with a fresh read."""
    frame = await receive(v)
    assert set(frame["joins"]) == {key(joins)} and frame["leaves"] == [key(leaves)], frame
    assert (frame["others"], frame["count"]) == (others, count)
    seen.apply(frame)
    await agrees_with_a_fresh_read(seen, viewer)


async def test_a_member_the_viewer_follows_takes_the_last_place(
    sockets: Sockets, make_user: Callable
) -> None:
    """The viewer follows a member it may see, counted in others (joined after the list's
    last member): a contact now, listed first by a fresh read, and by the viewer's list at
    once, in the place of its last member."""
    viewer = await new_user(make_user)
    first, second, third, followed = [await new_user(make_user) for _ in range(4)]
    await public(viewer, first, second, third, followed)
    _, v, seen = await open_in_order(sockets, viewer, [first, second, third, followed])
    assert seen.shows({key(viewer), key(first), key(second)}, 2), seen.members
    await assert_silent(v)

    assert await api.afollow(viewer, followed)
    await swapped_in(v, seen, viewer, followed, second, 2, 5)
    assert set(seen.members) == {key(viewer), key(followed), key(first)}
    await assert_silent(v)


async def test_a_member_the_viewer_unfollows_leaves_for_the_next_one(
    sockets: Sockets, make_user: Callable
) -> None:
    """The reverse: a contact listed ahead of members who joined before it, unfollowed, takes
    its place by join time (past the list's end), and the next member takes the place."""
    viewer = await new_user(make_user)
    first, second, third, friend = [await new_user(make_user) for _ in range(4)]
    await public(viewer, first, second, third, friend)
    await api.afollow(viewer, friend)
    _, v, seen = await open_in_order(sockets, viewer, [first, second, third, friend])
    assert seen.shows({key(viewer), key(friend), key(first)}, 2), seen.members
    await assert_silent(v)

    assert await api.aunfollow(viewer, friend)
    await swapped_in(v, seen, viewer, second, friend, 2, 5)
    await assert_silent(v)


async def test_following_a_hidden_member_shows_the_viewer_nothing(
    sockets: Sockets, make_user: Callable
) -> None:
    """Following a member whose privacy hides it from the viewer (the default, contacts:
    the viewer is none of its contacts) lists nothing and tells the viewer nothing."""
    viewer = await new_user(make_user)
    first, hidden, second, third = [await new_user(make_user) for _ in range(4)]
    await public(viewer, first, second, third)
    _, v, seen = await open_in_order(sockets, viewer, [first, hidden, second, third])
    assert seen.shows({key(viewer), key(first), key(second)}, 2), seen.members
    await assert_silent(v)

    assert await api.afollow(viewer, hidden)
    await assert_silent(v)
    await agrees_with_a_fresh_read(seen, viewer)


async def test_a_member_who_adds_the_viewer_takes_its_place_by_join_time(
    sockets: Sockets, make_user: Callable
) -> None:
    """A member hidden by its level (contacts) who joined before the list's last member adds
    the viewer to its contacts: visible to it now, listed at once in the last one's place."""
    viewer = await new_user(make_user)
    first, hidden, second, third = [await new_user(make_user) for _ in range(4)]
    await public(viewer, first, second, third)
    _, v, seen = await open_in_order(sockets, viewer, [first, hidden, second, third])
    assert seen.shows({key(viewer), key(first), key(second)}, 2), seen.members
    await assert_silent(v)

    assert await api.afollow(hidden, viewer)
    await swapped_in(v, seen, viewer, hidden, second, 2, 5)
    await assert_silent(v)


@pytest.mark.parametrize("viewer_blocks", [True, False], ids=["viewer-blocks", "member-blocks"])
async def test_a_block_lifted_lists_the_member_again_in_its_place(
    sockets: Sockets, make_user: Callable, viewer_blocks: bool
) -> None:
    """A block either way takes a listed member out (the next one takes the place); lifted, the
    member, who joined before the list's last member, takes its place again."""
    viewer = await new_user(make_user)
    first, member, second, third = [await new_user(make_user) for _ in range(4)]
    await public(viewer, first, member, second, third)
    _, v, seen = await open_in_order(sockets, viewer, [first, member, second, third])
    assert seen.shows({key(viewer), key(first), key(member)}, 2), seen.members
    await assert_silent(v)
    blocker, blocked = (viewer, member) if viewer_blocks else (member, viewer)

    assert await api.ablock(blocker, blocked)
    await swapped_in(v, seen, viewer, second, member, 1, 4)
    await assert_silent(v)

    assert await api.aunblock(blocker, blocked)
    await swapped_in(v, seen, viewer, member, second, 2, 5)
    await assert_silent(v)
