"""A room's read through its indexes (the public members' segments, the users looked up by id)
lists and counts exactly what a read of every member would, for a randomized population of
privacy levels, exceptions, blocks, invisible members and contacts; the index follows joins,
leaves, renewals and the sweep; a stranger's read of a room at default privacy resolves no
candidate.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from presence import api, relations
from presence.domain.rooms import parse_room
from presence.models import Block, Contact, PrivacyException, PrivacySettings
from presence.rooms import candidates, cursors, reading
from presence.store import get_store
from tests.rooms.rules import ROOMS

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site, pytest.mark.cluster]

ROOM = "lobby:indexed"
LEVELS = ["everyone", "contacts", "close_friends", "nobody", None]  # None: no row (default)


@pytest.fixture(autouse=True)
def _rooms(settings: Any) -> None:
    settings.PRESENCE = {"ROOMS": {**ROOMS, "lobby": None}, "ROOM_LIST_LIMIT": 4}


def enter(user: Any, at: float, room: str = ROOM) -> None:
    """``user`` online and in ``room``, with the flags a socket's join writes (their choices)."""
    api.touch(user)
    invisible, public = relations.shown_flags(user.pk)
    store = get_store()
    plan = store.plans.join_room(room, user.pk, f"c{user.pk}", at, None, invisible, public=public)
    assert store.run(plan) is not None


def scanning(room: str, viewer: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The room read down every member's join order (no index), to its end."""
    with monkeypatch.context() as patch:
        patch.setattr(reading.RoomEntry, "indexed", property(lambda self: False))
        patch.setattr(reading, "WIDEST_FACTOR", 10_000)
        return api.room_presence(room, viewer)


def comparable(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its next page's cursor decoded (its text is sealed with a fresh nonce)."""
    after = state.get("next")
    return {**state, "next": after and cursors.decode(parse_room(ROOM), after)}


def populate(rng: random.Random, make_user: Callable[..., Any], viewers: list[Any]) -> list[Any]:
    members = [make_user() for _ in range(40)]
    start = time.time() - 60
    for n, user in enumerate(members):
        level = rng.choice(LEVELS)
        if level is not None or rng.random() < 0.1:
            PrivacySettings.objects.create(
                user=user, online_visibility=level or "contacts", invisible=rng.random() < 0.1
            )
        for viewer in viewers:
            roll = rng.random()
            if roll < 0.25:  # the member shows the viewer more (or less) as a contact
                Contact.objects.create(owner=user, contact=viewer, close_friend=rng.random() < 0.5)
            if rng.random() < 0.15:  # the viewer lists the member first
                Contact.objects.create(owner=viewer, contact=user)
            if rng.random() < 0.15:
                PrivacyException.objects.create(
                    owner=user,
                    viewer=viewer,
                    setting=rng.choice(["online_visibility", "last_seen_visibility"]),
                    allow=rng.random() < 0.5,
                )
            if rng.random() < 0.08:
                blocker, blocked = (user, viewer) if rng.random() < 0.5 else (viewer, user)
                Block.objects.get_or_create(blocker=blocker, blocked=blocked)
        enter(user, start + n * 0.25)  # distinct join times
    return members


@pytest.mark.parametrize("seed", range(8))
def test_the_indexed_read_lists_and_counts_what_reading_every_member_does(
    seed: int, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    stranger, tied = make_user(), make_user()
    members = populate(rng, make_user, [tied])
    viewers = [stranger, tied, members[rng.randrange(len(members))]]
    for viewer in viewers:
        indexed = comparable(api.room_presence(ROOM, viewer))
        assert indexed == comparable(scanning(ROOM, viewer, monkeypatch)), (seed, viewer.pk)
    # Some listed, some not: the population exercises both sides.
    lists = [len(api.room_presence(ROOM, v)["members"]) for v in viewers]
    assert max(lists) > 0


def test_a_public_member_past_the_widest_is_listed(
    make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members who hide from strangers are not read at all: a public member past the first
    ``WIDEST_FACTOR * ROOM_LIST_LIMIT`` members is listed (a read down every member's join
    order stopped before it and counted it in ``others``)."""
    monkeypatch.setattr(reading, "WIDEST_FACTOR", 2)  # the first 8 members at a limit of 4
    start = time.time() - 60
    hidden = [make_user() for _ in range(10)]
    for n, user in enumerate(hidden):
        enter(user, start + n)
    shown = make_user()
    PrivacySettings.objects.create(user=shown, online_visibility="everyone")
    enter(shown, start + 20)
    viewer = make_user()
    state = api.room_presence(ROOM, viewer)
    assert list(state["members"]) == [str(shown.pk)]
    assert (state["others"], state["count"]) == (10, 11)
    with monkeypatch.context() as patch:
        patch.setattr(reading.RoomEntry, "indexed", property(lambda self: False))
        assert api.room_presence(ROOM, viewer)["members"] == {}


def test_a_strangers_read_at_default_privacy_resolves_nobody(
    make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    start = time.time() - 60
    for n in range(30):
        enter(make_user(), start + n)
    asked: list[Any] = []
    load = relations.load

    def counted(viewer: Any, ids: Any) -> Any:
        asked.extend(ids)
        return load(viewer, ids)

    monkeypatch.setattr(candidates.relations, "load", counted)
    state = api.room_presence(ROOM, make_user())
    assert (state["members"], state["count"]) == ({}, 30)
    assert asked == []


def test_the_index_follows_renewals_leaves_and_the_sweep(
    make_user: Callable[..., Any], redis_client: Any
) -> None:
    """A member's public flag rewritten by a renewal moves them in and out of the index; a
    member swept is out of it; the index's segments follow merges (the room's keys go with its
    last member)."""
    store = get_store()
    start = time.time() - 60
    users = [make_user() for _ in range(300)]
    for n, user in enumerate(users):
        PrivacySettings.objects.create(user=user, online_visibility="everyone")
        enter(user, start + n * 0.01)
    viewer = make_user()

    def listed() -> list[str]:
        return list(api.room_presence(ROOM, viewer)["members"])

    assert listed() == [str(u.pk) for u in users[:4]]
    # users[0] now hides: its renewal writes the flag (as recheck_rooms does on the change)
    plan = store.plans.join_room(ROOM, users[0].pk, f"c{users[0].pk}", time.time(), public=False)
    store.run(plan)
    PrivacySettings.objects.filter(user=users[0]).update(online_visibility="contacts")
    assert listed() == [str(u.pk) for u in users[1:5]]
    # the first 200 leave and are swept past their grace: segments empty out and merge
    now = time.time()
    for user in users[:200]:
        store.run(store.plans.leave_room(ROOM, user.pk, f"c{user.pk}", now))
    for user in users[200:]:  # the others renewed meanwhile, within their stays: their places kept
        store.run(store.plans.join_room(ROOM, user.pk, f"c{user.pk}", now, renew=True))
    now += 60
    pruned = store.run(store.plans.prune_room(ROOM, now, 1000))
    assert len(pruned.gone) == 200
    assert listed() == [str(u.pk) for u in users[200:204]]
    read = store.run(store.plans.read_room(ROOM, now, 1000, (), public_only=True))
    assert read is not None and read.complete
    assert set(read.members) == {u.pk for u in users[200:]}
    for user in users[200:]:
        store.run(store.plans.leave_room(ROOM, user.pk, f"c{user.pk}", now, at_once=True))
    store.run(store.plans.prune_room(ROOM, now, 1000))
    # the index went with the room's last member (its outbox waits for its claims)
    keys = {store.keys.room_key(ROOM, part) for part in ("n", "p", "g", "w")}
    assert not any(redis_client.exists(key) for key in keys)
