"""Member cards (PRESENCE["MEMBER_CARD"]) in the live frames: ``room_state`` and ``room_diff``
joins carry each listed member's card, never a hidden member's; a join seen by many viewers
costs one card for the whole delivery, not one per viewer (real Redis, real channel layer)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.live.sockets import Sockets, assert_silent, lets_see, new_user, receive
from tests.live.sockets import sockets as sockets
from tests.rooms import cards
from tests.rooms.test_sockets import SETTINGS, ClientView, join, key, public

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
]


@pytest.fixture(autouse=True)
def _card_settings(settings: Any) -> Iterator[None]:
    settings.PRESENCE = {**SETTINGS, "MEMBER_CARD": cards.CUSTOM}
    cards.calls.clear()
    yield
    cards.calls.clear()


def card(user: Any) -> dict[str, Any]:
    return {"name": f"{user.username.title()} Card", "avatar": f"/media/{user.username}.png"}


async def test_room_state_and_diffs_carry_the_listed_members_cards(
    sockets: Sockets, make_user: Callable
) -> None:
    alice, bob = await new_user(make_user), await new_user(make_user)
    await public(alice, bob)
    a, b = await sockets.open(alice), await sockets.open(bob)
    state = await join(a)
    assert state["members"][key(alice)]["card"] == card(alice)  # the viewer's own
    seen = ClientView(state)
    bobs_state = await join(b)
    assert {k: m["card"] for k, m in bobs_state["members"].items()} == {
        key(alice): card(alice),
        key(bob): card(bob),
    }
    await seen.until(a, {key(alice), key(bob)}, 0)
    assert seen.members[key(bob)]["card"] == card(bob)  # from the room_diff's joins
    # A meta change is a join again, with the card again.
    bobs_again = await join(b, meta={"mode": "editing"})
    assert bobs_again["members"][key(bob)]["card"] == card(bob)
    seen.apply(await receive(a))
    assert seen.members[key(bob)] == {
        "meta": {"mode": "editing"},
        "presence": seen.members[key(bob)]["presence"],
        "card": card(bob),
    }


async def test_a_hidden_member_gets_no_card(sockets: Sockets, make_user: Callable) -> None:
    viewer, hidden = await new_user(make_user), await new_user(make_user)
    v = await sockets.open(viewer)
    seen = ClientView(await join(v))
    h = await sockets.open(hidden)
    await join(h)
    await seen.until(v, {key(viewer)}, 1)  # counted, not listed: no card
    assert hidden.pk in cards.calls  # for their own room_state only
    cards.calls.clear()
    await assert_silent(v)
    # Once the hidden member lets the viewer see them, their card comes with their listing.
    await lets_see(hidden, viewer)
    await seen.until(v, {key(viewer), key(hidden)}, 0)
    assert seen.members[key(hidden)]["card"] == card(hidden)
    assert cards.calls == [hidden.pk]


async def test_a_join_seen_by_many_viewers_costs_one_card(
    sockets: Sockets, make_user: Callable
) -> None:
    viewers = [await new_user(make_user) for _ in range(5)]
    arriving = await new_user(make_user)
    await public(*viewers, arriving)
    views = []
    for viewer in viewers:
        communicator = await sockets.open(viewer)
        views.append((communicator, ClientView(await join(communicator))))
    everyone = {key(viewer) for viewer in viewers}
    for communicator, view in views:
        await view.until(communicator, everyone, 0)
    cards.calls.clear()
    await join(await sockets.open(arriving))  # its room_state: one card each for 6 members
    for communicator, view in views:
        await view.until(communicator, everyone | {key(arriving)}, 0)
        assert view.members[key(arriving)]["card"] == card(arriving)
    # The arrival's card: once for its own room_state, once for the delivery to all five
    # viewers (one per viewer would be 6).
    assert cards.calls.count(arriving.pk) == 2, cards.calls
