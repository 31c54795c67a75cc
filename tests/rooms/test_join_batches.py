"""Joins of one room made at about the same time on one process (presence.rooms.joins): written
and read as one batch, each joiner answered what its own read lists and counts, and a burst of
joins leaves every viewer's view as a fresh read says, in a few frames."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from presence import admission, api, domain, resolution
from presence.domain.rooms import parse_room
from presence.hub import Hub
from presence.models import Block, Contact, PrivacySettings
from presence.rooms import cursors, joins
from presence.rooms.reading import aroom_entry
from presence.store import get_store, merge
from tests.conftest import GatherPauses
from tests.live.sockets import BASE, Sockets, receive
from tests.live.sockets import sockets as sockets
from tests.rooms.rules import ROOMS
from tests.rooms.test_sockets import ClientView

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
]

ROOM = "post:2"


def cursor_place(text: str | None) -> Any:
    return None if text is None else cursors.decode(parse_room(ROOM), text)


@sync_to_async
def population(public_first: bool) -> tuple[list[Any], list[Any]]:
    """30 members in join order, 12 joiners with every kind of tie to them. ``public_first``:
    the first members by join time are public (a stranger's list fills from them); otherwise
    only the later ones are, and a stranger's read goes further down the room."""
    User = get_user_model()
    members = [User.objects.create_user(username=f"m{n}") for n in range(30)]
    joiners = [User.objects.create_user(username=f"j{n}") for n in range(12)]
    public = members[:20:2] if public_first else members[20:]
    for member in public:
        PrivacySettings.objects.create(user=member, online_visibility="everyone")
    PrivacySettings.objects.create(user=members[1], invisible=True)
    PrivacySettings.objects.create(user=joiners[4], invisible=True)
    for member in members[3:15:2]:
        Contact.objects.create(owner=member, contact=joiners[0])  # joiner 0 sees these
    Contact.objects.create(owner=joiners[1], contact=members[25])  # joiner 1 follows one
    Block.objects.create(blocker=members[0], blocked=joiners[2])
    Block.objects.create(blocker=joiners[3], blocked=members[22])
    for joiner in joiners[5:8]:
        PrivacySettings.objects.create(user=joiner, online_visibility="everyone")
    return members, joiners


@pytest.mark.parametrize("public_first", [True, False], ids=["public-first", "hidden-first"])
async def test_a_batch_answers_each_joiner_as_its_own_read(
    settings: Any, clock: Any, monkeypatch: pytest.MonkeyPatch, public_first: bool
) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 5}
    members, joiners = await population(public_first)
    store = get_store()
    now = time.time()
    everyone = members + joiners
    await store.arun(merge([store.plans.connection(u.pk, "open", now, "c") for u in everyone]))
    await store.arun(
        merge([store.plans.join_room(ROOM, u.pk, "c", now, None, u == members[1]) for u in members])
    )
    room = parse_room(ROOM)
    batch = [
        joins.Joining(user, f"j{n}", None, user == joiners[4], await aroom_entry(user, room, True))
        for n, user in enumerate(joiners)
    ]
    resolved = []
    real_resolve = domain.resolve

    def counting(*args: Any) -> Any:
        resolved.append(args[0])
        return real_resolve(*args)

    monkeypatch.setattr(domain, "resolve", counting)
    answers = await joins.ajoin_many(room, batch)
    monkeypatch.setattr(domain, "resolve", real_resolve)
    if public_first:
        # Once per (member, relation) for all the joiners, not once per (joiner, member).
        assert len(resolved) < len(everyone) * 2, len(resolved)
    for joiner, answer in zip(joiners, answers, strict=True):
        assert not isinstance(answer, BaseException), answer
        state, charged = answer
        fresh = await api.aroom_presence(ROOM, joiner)
        answered = state.as_dict()
        # Cursors are sealed with a fresh nonce each time: the same place, not the same text.
        places = [await sync_to_async(cursor_place)(d.pop("next")) for d in (answered, fresh)]
        assert places[0] == places[1], joiner.username
        assert answered == fresh, joiner.username
        assert charged > 0
    # Every join was written: each joiner counts itself among the members.
    assert (await api.aroom_presence(ROOM, joiners[5]))["count"] == len(everyone) - 2


async def test_a_burst_of_joins_on_one_process_leaves_every_view_fresh(
    settings: Any,
    clock: Any,
    sockets: Sockets,
    make_user: Callable,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """60 sockets join a room 60 viewers of this process are in, at once: few batches, each
    viewer's view (its room_state with the room_diffs applied) ends as a fresh read, in a few
    frames."""
    settings.PRESENCE = {
        **BASE,
        "ROOMS": ROOMS,
        "ROOM_LIST_LIMIT": 10,
        "RATE_LIMIT": (1000, 1),
        "CONNECTION_TTL": 7200,
    }

    @sync_to_async
    def people() -> tuple[list[Any], list[Any]]:
        viewers = [make_user(username=f"v{n}") for n in range(60)]
        joiners = [make_user(username=f"j{n}") for n in range(60)]
        for user in viewers[::3] + joiners[::2]:
            PrivacySettings.objects.create(user=user, online_visibility="everyone")
        for joiner in joiners[1:20:4]:
            Contact.objects.create(owner=joiner, contact=viewers[1])  # viewer 1 sees these
        Block.objects.create(blocker=joiners[0], blocked=viewers[2])
        return viewers, joiners

    viewers, joiners = await people()
    viewing = [await sockets.open(user) for user in viewers]
    views = []
    for communicator in viewing:
        # A second apart: members who joined in the same second are listed by id as text,
        # which a live view that listed them as they came does not follow (docs/rooms.md).
        clock.shift(1)
        await communicator.send_json_to({"type": "join", "room": ROOM, "meta": None})
        views.append(ClientView(await receive(communicator)))
    await _until_fresh(viewers, viewing, views)
    joining = [await sockets.open(user) for user in joiners]
    batches: list[int] = []
    real_many = joins.ajoin_many

    async def counted(room: Any, batch: Any, *shared: Any) -> Any:
        batches.append(len(batch))
        return await real_many(room, batch, *shared)

    monkeypatch.setattr(joins, "ajoin_many", counted)
    for view in views:
        view.frames = 0
    await asyncio.gather(
        *(c.send_json_to({"type": "join", "room": ROOM, "meta": None}) for c in joining)
    )
    for user, communicator in zip(joiners, joining, strict=True):
        state = await receive(communicator)
        assert state["type"] == "room_state", state
        fresh = await api.aroom_presence(ROOM, user)
        # Answered by its batch as its own read would, up to the joins written after it.
        assert set(state["members"]) <= set(fresh["members"]) | set(state["members"])
        assert state["count"] <= fresh["count"]
    assert sum(batches) == len(joiners) and len(batches) <= 10, batches
    await _until_fresh(viewers, viewing, views)
    assert max(view.frames for view in views) <= 3, [view.frames for view in views]


async def _until_fresh(viewers: list[Any], viewing: list[Any], views: list[ClientView]) -> None:
    """Apply each viewer's room_diffs until its view is what a fresh read shows it."""
    for user, communicator, view in zip(viewers, viewing, views, strict=True):
        fresh = await api.aroom_presence(ROOM, user)
        try:
            await asyncio.wait_for(
                view.until(communicator, set(fresh["members"]), fresh["others"]), 10
            )
        except TimeoutError:
            raise
        assert view.count == fresh["count"]
        for key, member in fresh["members"].items():
            assert view.members[key]["presence"] == member["presence"], (user, key)


@pytest.mark.parametrize("seed", range(3))
async def test_a_batch_reads_through_the_index_and_answers_each_joiner_as_its_own_read(
    settings: Any, clock: Any, make_user: Callable, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Joiners of every kind of tie (contacts, blocks, exceptions, levels; a randomized
    population) entered through the batch's entries (ties_of: the users who may show each
    more, as a joiner's own entry reads them): each answered what its own read lists and
    counts, the indexed joiners' first read taking the room's public members only."""
    from tests.rooms import test_indexed_read as indexed

    settings.PRESENCE = {"ROOMS": {**ROOMS, "lobby": None}, "ROOM_LIST_LIMIT": 4}
    rng = random.Random(seed)

    @sync_to_async
    def people() -> list[Any]:
        joiners = [make_user() for _ in range(6)]
        indexed.populate(rng, make_user, joiners)
        return joiners

    joiners = await people()
    room = parse_room(indexed.ROOM)
    entries = await joins._entries((room, True), joiners)
    for joiner, entry in zip(joiners, entries, strict=True):
        own = await aroom_entry(joiner, room, True)
        assert entry == own, joiner.pk  # the same ties, the same own facts
    asked: list[bool] = []
    real_read = get_store().plans.read_room

    def reading(*args: Any, **kwargs: Any) -> Any:
        asked.append(bool(args[4] if len(args) > 4 else kwargs.get("public_only")))
        return real_read(*args, **kwargs)

    monkeypatch.setattr(get_store().plans, "read_room", reading)
    batch = [
        joins.Joining(user, f"j{n}", None, entry.invisible(user.pk), entry, entry.public(user.pk))
        for n, (user, entry) in enumerate(zip(joiners, entries, strict=True))
    ]
    answers = await joins.ajoin_many(room, batch)
    monkeypatch.undo()
    assert True in asked  # the public members' index was read
    for joiner, answer in zip(joiners, answers, strict=True):
        assert not isinstance(answer, BaseException), answer
        answered = answer[0].as_dict()
        fresh = await api.aroom_presence(indexed.ROOM, joiner)
        places = [
            await sync_to_async(cursors.decode)(room, d.pop("next")) if d["next"] else None
            for d in (answered, fresh)
        ]
        assert places[0] == places[1], (seed, joiner.pk)
        assert answered == fresh, (seed, joiner.pk)


async def test_an_indexed_joiner_whose_list_fills_with_later_members_reads_further(
    settings: Any, clock: Any
) -> None:
    """The first public members read are partly not the joiner's to list (blocked), and users
    who show it more joined later: the batch does not stop at a full list of them, as the
    joiner's own read does not (public members further down joined earlier)."""
    settings.PRESENCE = {"ROOMS": {**ROOMS, "lobby": None}, "ROOM_LIST_LIMIT": 4}
    User = get_user_model()

    @sync_to_async
    def people() -> tuple[list[Any], list[Any], list[Any]]:
        public = [User.objects.create_user(username=f"p{n}") for n in range(8)]
        admitting = [User.objects.create_user(username=f"a{n}") for n in range(4)]
        joiners = [User.objects.create_user(username=f"j{n}") for n in range(2)]
        for user in public:
            PrivacySettings.objects.create(user=user, online_visibility="everyone")
        for joiner in joiners:
            Block.objects.create(blocker=joiner, blocked=public[0])
            Block.objects.create(blocker=public[1], blocked=joiner)
            for user in admitting:  # contacts-only members who have the joiner as contact
                Contact.objects.create(owner=user, contact=joiner)
        return public, admitting, joiners

    public, admitting, joiners = await people()
    store = get_store()
    now = resolution.now()
    everyone = public + admitting + joiners
    await store.arun(merge([store.plans.connection(u.pk, "open", now, "c") for u in everyone]))
    await store.arun(
        merge(
            [
                store.plans.join_room("lobby:late", u.pk, "c", now - 12 + n, public=u in public)
                for n, u in enumerate(public + admitting)
            ]
        )
    )
    room = parse_room("lobby:late")
    entries = await joins._entries((room, True), joiners)
    assert all(entry.indexed for entry in entries)
    batch = [
        joins.Joining(user, f"j{n}", None, False, entry, False)
        for n, (user, entry) in enumerate(zip(joiners, entries, strict=True))
    ]
    answers = await joins.ajoin_many(room, batch)
    for joiner, answer in zip(joiners, answers, strict=True):
        assert not isinstance(answer, BaseException), answer
        listed = set(answer[0].as_dict()["members"])
        fresh = await api.aroom_presence("lobby:late", joiner)
        assert (
            listed == set(fresh["members"]) == {str(joiner.pk), *(str(u.pk) for u in public[2:5])}
        )


async def test_a_batch_of_joins_whose_users_are_in_the_room_already_is_answered(
    settings: Any, sockets: Sockets, make_user: Callable
) -> None:
    """Joins that change nobody's presence in the room (their users are there already: a
    user's other tabs, or every socket of a restarted process joining again while its old
    entries last) announce nothing, and each is still answered its room_state; the sockets
    go on answering frames."""
    settings.PRESENCE = {**BASE, "ROOMS": ROOMS, "RATE_LIMIT": (1000, 1)}
    users = [await sync_to_async(make_user)(username=f"u{n}") for n in range(4)]
    first = [await sockets.open(user) for user in users]
    for communicator in first:
        await communicator.send_json_to({"type": "join", "room": ROOM, "meta": None})
        assert (await receive(communicator))["type"] == "room_state"
    again = [await sockets.open(user) for user in users for _ in range(2)]
    await asyncio.gather(
        *(c.send_json_to({"type": "join", "room": ROOM, "meta": None}) for c in again)
    )
    for communicator in again:
        state = await receive(communicator)
        assert state["type"] == "room_state", state
        assert state["count"] == len(users)
    # Still answering: a join of another room is answered too.
    await again[0].send_json_to({"type": "join", "room": "post:3", "meta": None})
    assert (await receive(again[0]))["type"] == "room_state"


async def test_the_joins_of_a_batch_keep_their_own_moments(settings: Any, clock: Any) -> None:
    """Each join of a batch is dated when it was asked, not all by the batch's one moment: a
    read takes the members of one millisecond together, so a live event's thousand joins
    dated alike would be read, and resolved, by every read of the room after them."""
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 5}
    _, joiners = await population(True)
    room = parse_room(ROOM)
    batch = []
    for n, user in enumerate(joiners):
        entry = await aroom_entry(user, room, True)
        batch.append(joins.Joining(user, f"j{n}", None, False, entry))
        clock.shift(0.004)  # the next frame a few milliseconds later
    asked = [round(joining.at * 1000) for joining in batch]
    assert len(set(asked)) == len(batch)
    answers = await joins.ajoin_many(room, batch)
    assert not [a for a in answers if isinstance(a, BaseException)]
    store = get_store()
    read = await store.arun(store.plans.read_room(ROOM, time.time(), 0, [u.pk for u in joiners]))
    joined = {uid: round(entry.joined_at) for uid, entry in read.members.items()}
    assert joined == {user.pk: ms for user, ms in zip(joiners, asked, strict=True)}


async def test_joiners_of_one_batch_tied_to_each_other_see_each_other_as_their_own_reads(
    settings: Any, clock: Any
) -> None:
    """Two users who show each other their online status (contacts either way, at default
    privacy) join in one batch, with a stranger: each is answered what its own read lists
    (the other one first, as a contact; the stranger sees neither)."""
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 5}

    @sync_to_async
    def people() -> list[Any]:
        User = get_user_model()
        ann, ben, cy = (User.objects.create_user(username=name) for name in ("ann", "ben", "cy"))
        Contact.objects.create(owner=ann, contact=ben)
        Contact.objects.create(owner=ben, contact=ann)
        return [ann, ben, cy]

    users = await people()
    store = get_store()
    await store.arun(merge([store.plans.connection(u.pk, "open", time.time(), "c") for u in users]))
    room = parse_room(ROOM)
    batch = [
        joins.Joining(user, f"j{n}", None, False, await aroom_entry(user, room, True))
        for n, user in enumerate(users)
    ]
    answers = await joins.ajoin_many(room, batch, joins.SharedListings())
    for user, answer in zip(users, answers, strict=True):
        assert not isinstance(answer, BaseException), answer
        answered = answer[0].as_dict()
        fresh = await api.aroom_presence(ROOM, user)
        answered.pop("next"), fresh.pop("next")
        assert answered == fresh, user.username
    ann, ben, _ = users
    assert list(answers[0][0].members) == [ann.pk, ben.pk]
    assert list(answers[1][0].members) == [ben.pk, ann.pk]


async def test_while_sockets_wait_for_their_turn_a_rooms_joins_gather_into_one_batch(
    settings: Any, clock: Any, monkeypatch: pytest.MonkeyPatch, gather_pauses: GatherPauses
) -> None:
    """A reconnect storm: the hub's joins of a room gather (presence.admission) before their
    batch, so joins arriving apart read the rule and the joiners' ties in one trip to the
    database's thread; each is answered what its own entry is. Without sockets waiting, a
    join goes at once, alone."""
    settings.PRESENCE = {"ROOMS": ROOMS, "OPENINGS_AT_ONCE": 1}
    _, joiners = await population(True)
    room = parse_room(ROOM)
    trips: list[int] = []
    one, many = joins.room_entry, joins.room_entries

    def entry_alone(viewer: Any, room: Any, own: bool) -> Any:
        trips.append(1)
        return one(viewer, room, own)

    def entries(room: Any, viewers: list[Any], own: bool) -> Any:
        trips.append(len(viewers))
        return many(room, viewers, own)

    monkeypatch.setattr(joins, "room_entry", entry_alone)
    monkeypatch.setattr(joins, "room_entries", entries)
    paused = gather_pauses.asked
    batches = Hub.get().rooms.joins
    # Alone: at once, without a pause.
    alone = await asyncio.wait_for(batches.entry(joiners[0], room, True), 5)
    assert trips == [1] and paused == []
    assert alone == await aroom_entry(joiners[0], room, True)
    # One opening under way, another waiting: joins a loop turn apart go together.
    slot = await admission.admit(joiners[0].pk)
    waiting = asyncio.ensure_future(admission.admit(joiners[1].pk))
    await asyncio.sleep(0)
    first = asyncio.ensure_future(batches.entry(joiners[2], room, True))
    await asyncio.sleep(0.01)
    later = [asyncio.ensure_future(batches.entry(j, room, True)) for j in joiners[3:6]]
    await asyncio.sleep(0.01)
    assert paused == [admission.GATHER_WHILE_WAITING] and not first.done()
    gather_pauses.resume.set()
    answered = await asyncio.wait_for(asyncio.gather(first, *later), 5)
    assert trips == [1, 4]
    for joiner, entry in zip(joiners[2:6], answered, strict=True):
        assert entry == await aroom_entry(joiner, room, True), joiner.username
    slot.release()
    (await asyncio.wait_for(waiting, 5)).release()
