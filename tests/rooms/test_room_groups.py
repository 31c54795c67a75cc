"""A room's channel-layer groups: a page left (presence.js leaves on pagehide) is mostly followed
by the next page joining the same rooms moments later, so the groups a left room needed linger
(presence.hub.groups.LINGER) instead of being left and joined again; a join that did not
happen (refused, failed) leaves them at once. Real Redis, real channel layer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from presence.announce import rooms_group_name
from presence.hub import Hub, groups
from tests.live.sockets import Sockets, assert_silent, eventually, new_user, receive
from tests.live.sockets import sockets as sockets
from tests.live.test_group_linger import layer_calls as layer_calls
from tests.rooms.test_sockets import ROOM, ClientView, join, key, leave, public
from tests.rooms.test_sockets import _room_settings as _room_settings  # autouse: the settings

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]


def hub_now() -> Hub:
    hub = Hub.current()
    assert hub is not None
    return hub


async def test_a_left_room_lingers_and_joining_it_again_calls_no_layer(
    sockets: Sockets, make_user: Callable[..., Any], layer_calls: list[tuple[str, str]]
) -> None:
    alice, bob = await new_user(make_user), await new_user(make_user)
    await public(alice, bob)
    others = await sockets.open(await new_user(make_user))  # the process serves others too
    a = await sockets.open(alice)
    assert (await join(a))["type"] == "room_state"
    await leave(a)
    group = hub_now().registry.rooms.group(ROOM)
    assert await eventually(lambda: group in hub_now().groups.lingering)
    assert ("group_discard", group) not in layer_calls
    # Meanwhile the room's messages reach this process and find no view: nothing is sent.
    b = await sockets.open(bob)
    assert (await join(b))["type"] == "room_state"
    await assert_silent(a)
    layer_calls.clear()

    seen = ClientView(await join(a))
    assert layer_calls == []  # neither the room's group nor that of every room view
    assert set(seen.members) == {key(alice), key(bob)}
    # The lingering group was the live one all along: bob's new meta reaches alice's view.
    await join(b, meta={"mode": "editing"})
    frame = await receive(a)
    assert frame["type"] == "room_diff", frame
    assert frame["joins"][key(bob)]["meta"] == {"mode": "editing"}
    await sockets.close(others)


async def test_a_refused_join_leaves_its_groups_at_once(
    sockets: Sockets, make_user: Callable[..., Any], layer_calls: list[tuple[str, str]]
) -> None:
    alice = await new_user(make_user)
    others = await sockets.open(await new_user(make_user))
    a = await sockets.open(alice)
    await a.send_json_to({"type": "join", "room": "group:3"})  # the rule refuses odd ids
    assert (await receive(a))["code"] == "forbidden"
    hub = hub_now()
    group = hub.registry.rooms.group("group:3")
    assert ("group_add", group) in layer_calls  # entered while the rule was asked
    assert ("group_discard", group) in layer_calls
    assert ("group_discard", rooms_group_name()) in layer_calls
    assert hub.groups.lingering == {}
    assert hub.registry.rooms.members == {}
    await sockets.close(others)


async def test_a_left_rooms_groups_are_left_after_linger(
    sockets: Sockets,
    make_user: Callable[..., Any],
    layer_calls: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(groups, "LINGER", 0.2)
    others = await sockets.open(await new_user(make_user))
    a = await sockets.open(await new_user(make_user))
    assert (await join(a))["type"] == "room_state"
    await sockets.close(a)  # a closed socket leaves its rooms: its groups linger too
    group = hub_now().registry.rooms.group(ROOM)

    def left() -> bool:
        return {("group_discard", group), ("group_discard", rooms_group_name())} <= set(layer_calls)

    assert await eventually(left)
    assert hub_now().groups.lingering == {}
    await sockets.close(others)
