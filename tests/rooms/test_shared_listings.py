"""A room's first members as a stranger sees them, kept for the batches of joins that follow
(presence.rooms.shared): a stranger is answered from it exactly what its own read answers; a
joiner with any tie to the first members (a contact, a block, a privacy exception either way,
its ties in the room) is resolved for as before; a change stamped for a first member, a change
of the first members, other settings or age make the next batch resolve them again.

Real Redis, real channel layer; time controlled (the change stamps are compared with it)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, NamedTuple

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from presence import api, relations
from presence.domain.rooms import Room, parse_room
from presence.models import PrivacyException, PrivacySettings
from presence.rooms import cards, joins, reading, shared
from presence.rooms.reading import aroom_entry
from presence.rooms.shared import KnownRooms, SharedListings
from presence.store import get_store, merge
from tests.live.sockets import BASE, Sockets, receive
from tests.live.sockets import sockets as sockets
from tests.rooms.rules import ROOMS
from tests.rooms.test_join_batches import ROOM, cursor_place, population

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
]


@sync_to_async
def strangers(count: int) -> list[Any]:
    User = get_user_model()
    return [User.objects.create_user(username=f"s{n}") for n in range(count)]


@sync_to_async
def excepting(members: list[Any], joiners: list[Any]) -> None:
    """joiner 9: the first public member never shows them its online status; joiner 10: the
    second always shows them its last seen (whatever shows them more or less than a stranger
    is no stranger's view)."""
    PrivacyException.objects.create(
        owner=members[0], viewer=joiners[9], setting="online_visibility", allow=False
    )
    PrivacyException.objects.create(
        owner=members[2], viewer=joiners[10], setting="last_seen_visibility", allow=True
    )


def set_online_visibility(member: Any, visibility: str) -> None:
    """The member's online visibility saved as the site does it: committed, announced and
    stamped (the next listing or read reads the member again)."""
    privacy = PrivacySettings.objects.get(user=member)
    privacy.online_visibility = visibility
    privacy.save()


aset_online_visibility = sync_to_async(set_online_visibility)


@sync_to_async
def shows_last_seen(members: list[Any], joiners: list[Any]) -> None:
    """m0 shows everyone its last seen (which a heartbeat moves without a change stamped)."""
    PrivacySettings.objects.filter(user=members[0]).update(last_seen_visibility="everyone")


async def in_room(members: list[Any], others: list[Any], now: float, clock: Any) -> None:
    """Every user with an open connection; the members in the room, in order. Then the clock
    moves past the stamps of their coming online (a listing is proven by their absence)."""
    store = get_store()
    everyone = members + others
    await store.arun(merge([store.plans.connection(u.pk, "open", now, "c") for u in everyone]))
    # a millisecond apart: a read takes the members who joined in one millisecond together
    joins = [
        store.plans.join_room(ROOM, u.pk, "c", now, None, u == members[1], joined_at=now - n / 1000)
        for n, u in enumerate(reversed(members))
    ]
    await store.arun(merge(joins))
    clock.shift(5)


async def batch(room: Room, users: list[Any], tag: str) -> list[joins.Joining]:
    found = []
    for n, user in enumerate(users):
        entry = await aroom_entry(user, room, True)
        found.append(joins.Joining(user, f"{tag}{n}", None, entry.invisible(user.pk), entry))
    return found


async def assert_as_own_read(users: list[Any], answers: list[Any]) -> None:
    """Each answer is what the user's own read of the room gives now."""
    for user, answer in zip(users, answers, strict=True):
        assert not isinstance(answer, BaseException), answer
        answered = answer[0].as_dict()
        fresh = await read_afresh(user)
        # Cursors are sealed with a fresh nonce each time: the same place, not the same text.
        places = [await sync_to_async(cursor_place)(d.pop("next")) for d in (answered, fresh)]
        assert places[0] == places[1], user.username
        assert answered == fresh, user.username


async def read_afresh(user: Any) -> dict[str, Any]:
    """The user's read of the room with nothing kept of earlier reads (presence.rooms.shared)."""
    kept, reading.KNOWN = reading.KNOWN, KnownRooms()
    try:
        return await api.aroom_presence(ROOM, user)
    finally:
        reading.KNOWN = kept


class Reads:
    """The users whose facts (with their relations to the joiners) each batch reads."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.batches: list[set[Any]] = []
        load_pairs = relations.aload_pairs

        async def counted(viewers: Any, targets: Any) -> Any:
            self.batches.append(set(targets))
            return await load_pairs(viewers, targets)

        monkeypatch.setattr(relations, "aload_pairs", counted)

    def last(self) -> set[Any]:
        return self.batches[-1]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    return Reads(monkeypatch)


async def joined(
    room: Room, users: list[Any], tag: str, listings: SharedListings, reads: Reads
) -> tuple[set[Any], list[Any]]:
    """The users' joins as one batch: whose facts it read, and the answers (each checked
    against the user's own read)."""
    answers = await joins.ajoin_many(room, await batch(room, users, tag), listings)
    await assert_as_own_read(users, answers)
    return reads.last(), answers


def pks(users: list[Any]) -> set[Any]:
    return {user.pk for user in users}


async def first_members(room: Room) -> set[Any]:
    """The room's first members a read through its index takes (its first public ones)."""
    store = get_store()
    read = await store.arun(store.plans.read_room(ROOM, time.time(), 5, (), True))
    return set(read.members)


class Scene(NamedTuple):
    """The population of test_join_batches in the room, with strangers beside it."""

    members: list[Any]
    joiners: list[Any]
    others: list[Any]
    room: Room
    listings: SharedListings
    first: set[Any]


async def scene(
    settings: Any,
    clock: Any,
    others: int,
    before: Callable[[list[Any], list[Any]], Awaitable[None]] | None = None,
    **presence: Any,
) -> Scene:
    """``others`` strangers more; ``before`` writes what must be stamped before the listing's
    time (the clock moves past the population's own stamps after it)."""
    settings.PRESENCE = {"ROOMS": ROOMS, "ROOM_LIST_LIMIT": 5, **presence}
    members, joiners = await population(public_first=True)
    if before is not None:
        await before(members, joiners)
    extra = await strangers(others)
    clock.shift(10)
    await in_room(members, joiners + extra, time.time(), clock)
    room = parse_room(ROOM)
    return Scene(members, joiners, extra, room, SharedListings(), await first_members(room))


async def test_a_batch_after_another_reads_only_the_first_members_its_joiners_are_tied_to(
    settings: Any, clock: Any, reads: Reads
) -> None:
    at = await scene(settings, clock, 2, excepting)
    members, joiners, others, room, listings, first = at
    # (m1 is invisible: read, but not one of the five a read counts towards its reach)
    assert first == pks(members[:6])

    read, _ = await joined(room, [others[0]], "a", listings, reads)
    assert first <= read and len(listings) == 1  # resolved, and kept

    read, _ = await joined(room, [*joiners, others[1]], "b", listings, reads)
    # Of the first members, only those a joiner is tied to: m0 blocks j2 and never shows j9
    # its online status, m2 always shows j10 its last seen, m3 and m5 have j0 among their
    # contacts. Each joiner's other ties are read as before (its contacts and those who may
    # show it more, found in the room).
    assert read & first == pks([members[0], members[2], members[3], members[5]])
    assert pks([members[25], members[22], members[3]]) <= read


async def test_a_first_member_who_changed_is_read_again_and_other_first_members_all(
    settings: Any, clock: Any, reads: Reads
) -> None:
    members, _, others, room, listings, first = await scene(settings, clock, 7)
    await joined(room, [others[0]], "a", listings, reads)
    assert (await joined(room, [others[1]], "b", listings, reads))[0] == set()

    # a first member: its change is stamped, it alone is read again
    await aset_online_visibility(members[2], "nobody")
    clock.shift(1)
    read, answers = await joined(room, [others[2]], "c", listings, reads)
    assert read == pks([members[2]])
    assert str(members[2].pk) not in answers[0][0].as_dict()["members"]
    # Kept again, but as of when the listing it used was made (nothing is kept past MAX_AGE,
    # however often a batch reads a changed member): past that, every first member is read
    # again, and what that batch keeps holds.
    clock.shift(1.5)
    assert first <= (await joined(room, [others[3]], "d", listings, reads))[0]
    clock.shift(0.5)
    assert (await joined(room, [others[4]], "e", listings, reads))[0] == set()

    # The first member leaves at once: the first members are others now.
    store = get_store()
    await store.arun(store.plans.leave_room(ROOM, members[0].pk, "c", time.time(), at_once=True))
    read, answers = await joined(room, [others[5]], "f", listings, reads)
    assert (first - pks([members[0]])) <= read
    assert str(members[0].pk) not in answers[0][0].as_dict()["members"]
    assert (await joined(room, [others[6]], "g", listings, reads))[0] == set()


async def test_a_listing_too_old_or_made_under_other_settings_is_read_again(
    settings: Any, clock: Any, reads: Reads
) -> None:
    _, _, others, room, listings, first = await scene(settings, clock, 5)
    await joined(room, [others[0]], "a", listings, reads)
    clock.shift(shared.MAX_AGE + 0.5)
    assert first <= (await joined(room, [others[1]], "b", listings, reads))[0]
    assert (await joined(room, [others[2]], "c", listings, reads))[0] == set()

    # Everyone shows their online status to everyone now: strangers see every member.
    settings.PRESENCE = {
        "ROOMS": ROOMS,
        "ROOM_LIST_LIMIT": 5,
        "DEFAULT_PRIVACY": {"online_visibility": "everyone"},
    }
    read, answers = await joined(room, [others[3]], "d", listings, reads)
    assert answers[0][0].members and read  # read again: its first members are all public now
    assert (await joined(room, [others[4]], "e", listings, reads))[0] == set()


async def test_with_reciprocal_last_seen_nothing_is_shared(
    settings: Any, clock: Any, reads: Reads
) -> None:
    """A viewer's own choices then count for every member: no two viewers share a listing."""
    at = await scene(settings, clock, 4, RECIPROCAL_LAST_SEEN=True)
    _, _, others, room, listings, first = at
    # (batches of two: a join alone is then read as before batches)
    await joined(room, others[:2], "a", listings, reads)
    assert first <= (await joined(room, others[2:], "b", listings, reads))[0]
    assert len(listings) == 0


async def test_sockets_joining_after_one_another_read_the_first_members_once(
    settings: Any, clock: Any, sockets: Sockets, reads: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reconnect storm's rejoins, one after another on one process: the first reads and
    resolves the room's first members and their cards, the next are answered from it (only
    the joiner's own card read), each room_state as its own read, every member with a card."""
    cards_read: list[set[str]] = []
    cards_for_keys = cards.cards_for_keys

    def counted(keys: Any) -> Any:
        cards_read.append(set(keys))
        return cards_for_keys(keys)

    monkeypatch.setattr(cards, "cards_for_keys", counted)
    settings.PRESENCE = {**BASE, "ROOMS": ROOMS, "ROOM_LIST_LIMIT": 5, "CONNECTION_TTL": 3600}
    members, _ = await population(public_first=True)
    joiners = await strangers(4)
    clock.shift(10)
    await in_room(members, [], time.time(), clock)
    first = await first_members(parse_room(ROOM))
    for n, user in enumerate(joiners):
        socket = await sockets.open(user)
        await socket.send_json_to({"type": "join", "room": ROOM, "meta": None})
        state = await receive(socket)
        assert state["type"] == "room_state", state
        fresh = await api.aroom_presence(ROOM, user)
        assert state["members"].keys() == fresh["members"].keys(), n
        assert (state["others"], state["count"]) == (fresh["others"], fresh["count"]), n
        assert reads.batches[0] == first
        assert reads.batches[1:] == [set()] * n
        assert all("card" in member for member in state["members"].values())
        # the first frame's members' cards read once; then only each joiner's own
        assert cards_read[-1] == (set(state["members"]) if n == 0 else {str(user.pk)})
        clock.shift(0.1)


async def test_cards_that_cannot_be_read_are_left_out_the_known_ones_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The database failing while a frame's cards are read: the members whose card a shared
    listing knows get it, the others go without one (presence.js names them from the room's
    endpoint), not a made-up card."""

    def failing(keys: Any) -> Any:
        raise OSError("the database is gone")

    monkeypatch.setattr(cards, "cards_for_keys", failing)
    ann = {"name": "Ann", "avatar": None}
    frame = {"1": {"meta": None}, "2": {"meta": None}}
    await cards.add_cards([frame], {"1": ann})
    assert frame == {"1": {"meta": None, "card": ann}, "2": {"meta": None}}
    alone = {"2": {"meta": None}}
    await cards.add_cards([alone])
    assert alone == {"2": {"meta": None}}


async def test_a_listing_kept_again_holds_no_longer_than_max_age(
    settings: Any, clock: Any, reads: Reads
) -> None:
    """A batch that reads a changed first member keeps the listing again, but as of when the
    listing it used was made: a member's last seen, which its heartbeats move without a change
    stamped, is at most MAX_AGE (and a heartbeat's interval) behind, however long a member
    changes between batches."""

    members, _, others, room, listings, _ = await scene(settings, clock, 22, shows_last_seen)
    store = get_store()
    await joined(room, [others[0]], "a", listings, reads)
    for n in range(20):  # 30 s of batches, each 1.5 s after the last
        clock.shift(1.5)
        await store.arun(store.plans.connection(members[0].pk, "beat", time.time(), "c"))
        # stamped: the member is read again by the next batch
        await aset_online_visibility(members[2], "nobody" if n % 2 else "everyone")
        await joins.ajoin_many(room, await batch(room, [others[n + 1]], f"b{n}"), listings)
    answers = await joins.ajoin_many(room, await batch(room, [others[21]], "c"), listings)
    fresh = await read_afresh(others[21])

    def last_seen(answer: dict[str, Any]) -> datetime:
        presence = answer["members"][str(members[0].pk)]["presence"]
        return datetime.fromisoformat(presence["last_seen"])

    behind = (last_seen(fresh) - last_seen(answers[0][0].as_dict())).total_seconds()
    assert 0 <= behind <= shared.MAX_AGE + 1.5
