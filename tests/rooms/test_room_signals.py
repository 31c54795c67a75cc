"""presence.signals' room_entered / room_left: once per transition on the whole site, whatever
the connections of the user in the room and the processes they are on (two hubs here, each
with its own channel layer, as two processes), at once on a refusal, after the grace on a
leave, and never twice (nor lost) when the caller that made a transition never claims it (a
process killed between the script and the claim): the room's sweep sends it past the deadline.

Real Redis, real channels_redis layer, WebsocketCommunicator; time controlled with the
``clock`` fixture. Across real daphne processes: tests/load/test_signals_multiprocess.py.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async

from presence import api, outbox, signals
from presence.conf import get_settings
from presence.domain.rooms import Room, parse_room
from presence.rooms import joins
from presence.rooms import writes as events
from presence.rooms.reading import aroom_entry
from presence.store import Plan, get_store, merge
from presence.users import pk_kind
from tests.clock import at
from tests.live.sockets import Sockets, new_user, receive
from tests.live.sockets import sockets as sockets
from tests.live.test_signals import later
from tests.rooms import rules
from tests.rooms.test_sockets import SETTINGS, join, leave

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]

ROOM = "post:1"
CLUB = "club:1"
#: (kind, user id, room, at)
Got = tuple[str, Any, str, Any]


@pytest.fixture(autouse=True)
def _room_settings(settings: Any) -> Iterator[None]:
    settings.PRESENCE = {
        **SETTINGS,
        "ROOMS": {**SETTINGS["ROOMS"], "club": "tests.rooms.rules.revocable"},
    }
    rules.refused.clear()
    yield
    rules.refused.clear()


@pytest.fixture
def room_signals() -> Iterator[list[Got]]:
    """What room_entered / room_left sent in this test."""
    got: list[Got] = []

    def entered(sender: Any, user_id: Any, room: str, at: Any, **kwargs: Any) -> None:
        got.append(("entered", user_id, room, at))

    def left(sender: Any, user_id: Any, room: str, at: Any, **kwargs: Any) -> None:
        got.append(("left", user_id, room, at))

    signals.room_entered.connect(entered)
    signals.room_left.connect(left)
    yield got
    signals.wait_sent()
    signals.room_entered.disconnect(entered)
    signals.room_left.disconnect(left)


async def sent(got: list[Got], user: Any = None) -> list[Got]:
    """What was sent (of ``user`` alone where given), once the receivers had it."""
    await asyncio.to_thread(signals.wait_sent)
    return [each for each in got if user is None or each[1] == user.pk]


def outbox_size(room: str = ROOM) -> int:
    """Entries of the room's outbox nobody claimed yet."""
    store = get_store()
    plan = Plan(
        commands=[("ZCARD", store.keys.room_key(room, "o"))], parse=lambda r: r[0], fallback=0
    )
    return int(store.run(plan))


async def test_once_per_transition_whatever_the_connections(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    room_signals: list[Got],
) -> None:
    grace = get_settings().OFFLINE_GRACE
    user = await new_user(make_user)
    tabs = [await sockets.open(user), await sockets.open(user)]
    for tab in tabs:
        assert (await join(tab))["type"] == "room_state"
    assert await sent(room_signals) == [("entered", user.pk, ROOM, at(0))]

    # One tab leaves, the other closes, and a reload joins within the grace: no transition.
    await later(clock, 10)
    await leave(tabs[0])
    await sockets.close(tabs[1])
    await later(clock, grace)
    again = await sockets.open(user)
    await join(again)
    await later(clock, 1)
    await events.asweep_rooms()
    assert await sent(room_signals) == [("entered", user.pk, ROOM, at(0))]

    # Gone for good: left once, when its stay ended (the grace from the end of the close's
    # second), whatever the number of sweeps.
    await sockets.close(again)
    closed = 10 + grace + 1
    await later(clock, grace + 1)
    await events.asweep_rooms()
    await later(clock, 60)
    await events.asweep_rooms()
    await events.asweep_rooms()
    assert await sent(room_signals) == [
        ("entered", user.pk, ROOM, at(0)),
        ("left", user.pk, ROOM, at(closed + 1 + grace)),
    ]
    assert outbox_size() == 0


async def test_racing_writers_send_one_entered_and_one_left(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    room_signals: list[Got],
) -> None:
    """Connections of one user joining at once, as from as many processes (the room's script
    decides who made the user enter), then leaving, and sweeps racing: one of each. Across
    real processes: tests/load/test_signals_multiprocess.py."""
    user = await new_user(make_user)
    room = Room("post", "1")
    connections = [f"c{n}" for n in range(6)]
    writes = await asyncio.gather(
        *(events.ajoin_room(user, c, room, None, False) for c in connections)
    )
    assert sum(bool(write and write.joined) for write in writes) == 1
    assert await sent(room_signals) == [("entered", user.pk, ROOM, at(0))]
    await later(clock, 1)
    await asyncio.gather(*(events.aleave_rooms(user, c, [room]) for c in connections))
    await later(clock, get_settings().OFFLINE_GRACE + 2)
    await asyncio.gather(*(events.asweep_rooms() for _ in range(4)))
    assert await sent(room_signals) == [
        ("entered", user.pk, ROOM, at(0)),
        ("left", user.pk, ROOM, at(1 + 1 + get_settings().OFFLINE_GRACE)),
    ]
    assert outbox_size() == 0


async def test_a_refused_member_leaves_at_once(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    room_signals: list[Got],
) -> None:
    user = await new_user(make_user)
    tabs = [await sockets.open(user), await sockets.open(user)]
    for tab in tabs:
        assert (await join(tab, CLUB))["type"] == "room_state"
    await later(clock, 3)
    rules.refused.add((user.pk, "1"))
    await sync_to_async(api.recheck_room)(CLUB)
    for tab in tabs:
        assert (await receive(tab))["code"] == "forbidden"
    # Left when the second connection was refused (no grace), once; no sweep sends it again.
    assert await sent(room_signals) == [
        ("entered", user.pk, CLUB, at(0)),
        ("left", user.pk, CLUB, at(3)),
    ]
    assert (await api.aroom_presence(CLUB, await new_user(make_user)))["count"] == 0
    await later(clock, outbox.deadline() + 60)
    await events.asweep_rooms()
    assert len(await sent(room_signals)) == 2


async def test_an_entered_whose_caller_never_claimed_it_is_sent_once_by_the_sweep(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    room_signals: list[Got],
) -> None:
    """The join's process died between the script and the claim: the room's sweep sends it
    past the deadline, once; the caller's claim coming late sends nothing."""
    user = await new_user(make_user)
    store = get_store()
    write = await store.arun(store.plans.join_room(ROOM, user.pk, "c", at(0).timestamp()))
    assert write is not None and [t.made for t in write.made] == [1]
    await later(clock, outbox.deadline() - 1)
    await events.asweep_rooms()
    assert await sent(room_signals) == []
    await later(clock, 1)
    await events.asweep_rooms()
    await events.asweep_rooms()
    assert await sent(room_signals) == [("entered", user.pk, ROOM, at(0))]
    outbox.send_made(write)  # the caller's claim, too late: the sweep had it
    assert len(await sent(room_signals)) == 1
    assert outbox_size() == 0


async def test_a_left_whose_sweeper_died_is_sent_once(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    room_signals: list[Got],
) -> None:
    """A sweeper removed the room's last member and died before claiming the leave (and
    before putting the room back in its schedule): presence_cleanup finds the room's outbox
    and sends it, once; the members' own signals are not sent twice."""
    ann, ben = await new_user(make_user), await new_user(make_user)
    store = get_store()
    events_made = []
    for user in (ann, ben):
        write = await store.arun(store.plans.join_room(ROOM, user.pk, "c", at(0).timestamp()))
        events_made.append(write)
        outbox.send_made(write)
        await store.arun(store.plans.leave_room(ROOM, user.pk, "c", at(0).timestamp()))
    assert [kind for kind, *_ in await sent(room_signals)] == ["entered", "entered"]
    await later(clock, get_settings().OFFLINE_GRACE + 2)
    now = at(get_settings().OFFLINE_GRACE + 2).timestamp()
    assert await store.arun(store.plans.claim_rooms(now, 10)) == [ROOM]
    pruned = await store.arun(store.plans.prune_room(ROOM, now, 100))
    assert sorted(pruned.gone) == sorted([ann.pk, ben.pk])
    # ... and the sweeper is killed here: nothing claimed, the room not scheduled again.
    await events.asweep_rooms()
    assert len(await sent(room_signals)) == 2
    await later(clock, outbox.deadline())
    await sync_to_async(api.cleanup)()
    await sync_to_async(api.cleanup)()
    got = await sent(room_signals)
    assert sorted(kind for kind, *_ in got) == ["entered", "entered", "left", "left"]
    assert {user for kind, user, *_ in got if kind == "left"} == {ann.pk, ben.pk}
    assert outbox_size() == 0
    assert events_made  # the writes' replies, claimed by their callers above


async def test_a_room_emptied_by_a_sweep_stays_due_while_its_leaves_are_unclaimed(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    room_signals: list[Got],
) -> None:
    """A sweep that removes the room's last member puts the room back in its schedule (as
    the sweeper does with its prune's due) while the batch of leaves it made is in the room's
    outbox: its claim never made (it failed, or the receivers' thread never got to it), a
    later sweep anywhere sends each room_left, once, past the outbox's deadline."""
    ann = await new_user(make_user)
    store = get_store()
    outbox.send_made(await store.arun(store.plans.join_room(ROOM, ann.pk, "c", at(0).timestamp())))
    await store.arun(store.plans.leave_room(ROOM, ann.pk, "c", at(0).timestamp()))
    await later(clock, get_settings().OFFLINE_GRACE + 2)
    now = at(get_settings().OFFLINE_GRACE + 2).timestamp()
    assert await store.arun(store.plans.claim_rooms(now, 10)) == [ROOM]
    pruned = await store.arun(store.plans.prune_room(ROOM, now, 100))
    assert pruned.gone == [ann.pk]
    if pruned.due != math.inf:  # put back as the sweeper does
        await store.arun(store.plans.schedule_rooms({ROOM: pruned.due}))
    # ... the batch's claim never made. Sweeps before its deadline leave it to its claimer.
    await later(clock, outbox.deadline() - 1)
    await events.asweep_rooms()
    assert [kind for kind, *_ in await sent(room_signals)] == ["entered"]
    await later(clock, 1)
    await events.asweep_rooms()
    await events.asweep_rooms()
    assert [kind for kind, *_ in await sent(room_signals)] == ["entered", "left"]
    assert outbox_size() == 0


async def test_a_sweeps_batch_of_leaves_is_sent_once_each(
    clock: time_machine.Coordinates, room_signals: list[Got]
) -> None:
    """A sweep removes 300 members at once (whole segments and a part of one; invisible
    members and members with meta among them) and records their leaves as one outbox entry:
    each room_left is sent once, at the end of that member's stay, even when two claimers race
    for the batch (the second sends none); the members left behind are read and counted as
    before, and those gone join again as new members."""
    store = get_store()
    start = at(0).timestamp()
    # ids of the site's key type (the UUID run too), in the order of their numbers
    as_id = (lambda n: uuid.UUID(int=n)) if pk_kind() == "uuid" else (lambda n: n)
    users = [as_id(n) for n in range(10_001, 10_361)]
    writes = []
    for n, uid in enumerate(users):
        meta = f'{{"n":{n}}}' if n % 7 == 0 else None
        writes.append(
            store.plans.join_room(ROOM, uid, f"c{uid}", start + n * 0.001, meta, n % 5 == 0)
        )
    for write in await store.arun(merge(writes)):
        outbox.send_made(write)
    # The last 60 stay (a heartbeat), the first 300 leave: their grace ends at two times.
    grace = get_settings().OFFLINE_GRACE
    await later(clock, 10)
    beats = [
        store.plans.join_room(ROOM, uid, f"c{uid}", at(10).timestamp(), None, n % 5 == 0, True)
        for n, uid in enumerate(users[300:], 300)
    ]
    await store.arun(merge(beats))
    leaves = [
        store.plans.leave_room(ROOM, uid, f"c{uid}", at(0 if n < 150 else 5).timestamp())
        for n, uid in enumerate(users[:300])
    ]
    await store.arun(merge(leaves))
    await asyncio.to_thread(signals.wait_sent)
    room_signals.clear()
    await later(clock, grace + 2)
    now = at(grace + 12).timestamp()
    pruned = await store.arun(store.plans.prune_room(ROOM, now, 1000))
    assert sorted(pruned.gone) == users[:300]
    assert len({t.entry for t in pruned.made}) == 1  # one entry for the batch
    outbox.send_made(pruned)
    outbox.send_made(pruned)  # a second claimer of the same batch
    got = await sent(room_signals)
    assert sorted(user for kind, user, *_ in got if kind == "left") == users[:300]
    assert len(got) == 300
    ends = {user: when.timestamp() for _, user, _, when in got}
    assert {ends[uid] for uid in users[:150]} == {int(at(grace + 1).timestamp())}
    assert {ends[uid] for uid in users[150:300]} == {int(at(grace + 6).timestamp())}
    assert outbox_size() == 0
    count = await store.arun(store.plans.room_count(ROOM, now))
    read = await store.arun(store.plans.read_room(ROOM, now, 100, [users[0], users[-1]]))
    assert count == read.present == 60
    assert list(read.members)[:60] == users[300:] and read.found == {users[-1]}
    assert read.invisible == {uid for n, uid in enumerate(users) if n >= 300 and n % 5 == 0}
    again = await store.arun(store.plans.join_room(ROOM, users[0], "c", now))
    assert again is not None and again.joined
    assert await store.arun(store.plans.room_count(ROOM, now)) == 61


async def test_a_batch_of_joins_sends_its_room_entered_at_once(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    room_signals: list[Got],
) -> None:
    """Joins of one room written together (presence.rooms.joins: a live event's page opening
    on many screens) send each joiner's room_entered as a join alone does: at once, not left
    to the room's sweep past the outbox's deadline."""
    users = [await new_user(make_user) for _ in range(3)]
    room = parse_room(ROOM)
    batch = [
        joins.Joining(user, f"c{n}", None, False, await aroom_entry(user, room, True))
        for n, user in enumerate(users)
    ]
    answers = await joins.ajoin_many(room, batch)
    assert all(not isinstance(answer, BaseException) for answer in answers), answers
    got = await sent(room_signals)
    assert sorted(got, key=lambda each: str(each[1])) == sorted(
        (("entered", user.pk, ROOM, at(0)) for user in users), key=lambda each: str(each[1])
    )
    assert outbox_size() == 0
