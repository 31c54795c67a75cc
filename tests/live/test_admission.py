"""presence.admission: a process works on a few sockets' openings at once (a reconnect storm);
the others are accepted at once and wait their turn (each user's first come first served, the
users in turn, one user holding at most PLACES_PER_USER places) until the one before them had
its first snapshot, closed, was refused, or held its place for OPENING_HOLD (both settings:
PRESENCE["OPENINGS_AT_ONCE"], PRESENCE["OPENING_HOLD"]). A socket past MAX_CONNECTIONS_PER_USER
in the process is refused before it waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from presence import admission
from presence.rooms.joins import JoinBatches
from presence.store import get_store
from tests.conftest import GatherPauses
from tests.ids import wire_id
from tests.live.sockets import (
    TIMEOUT,
    Sockets,
    assert_silent,
    connections_in_redis,
    eventually,
    new_user,
    receive,
    refused,
    state,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets

#: user ids of the tests of the gate alone
USER, OTHER = 1, 2


def admit_one_at_a_time(settings: Any, hold: float, **more: Any) -> None:
    settings.PRESENCE = {**settings.PRESENCE, "OPENINGS_AT_ONCE": 1, "OPENING_HOLD": hold, **more}


@pytest.fixture
def one_at_a_time(settings: Any) -> None:
    admit_one_at_a_time(settings, hold=30.0)


async def second_behind_first(
    sockets: Sockets, make_user: Callable[..., Any]
) -> tuple[WebsocketCommunicator, WebsocketCommunicator]:
    """Two sockets opened in turn, both accepted at once; the first holds the one place, the
    second has asked for its snapshot and waits its turn."""
    ahead, behind = [await new_user(make_user) for _ in range(2)]
    first = sockets.make(ahead)
    assert (await first.connect(timeout=TIMEOUT))[0]
    second = sockets.make(behind)
    assert (await second.connect(timeout=TIMEOUT))[0]
    await second.send_json_to({"type": "subscribe", "users": []})
    return first, second


@pytest.mark.usefixtures("one_at_a_time")
async def test_a_slot_is_given_back_once_and_to_the_first_waiting() -> None:
    slot = await admission.admit(USER)
    slot.release()
    slot.release()  # a second release frees no second place
    again = await admission.admit(USER)
    first = asyncio.ensure_future(admission.admit(USER))
    second = asyncio.ensure_future(admission.admit(USER))
    await asyncio.sleep(0.05)
    assert not first.done() and not second.done()
    again.release()
    assert (await asyncio.wait_for(first, TIMEOUT)).held
    await asyncio.sleep(0.05)
    assert not second.done()
    first.result().release()
    (await asyncio.wait_for(second, TIMEOUT)).release()


@pytest.mark.usefixtures("one_at_a_time")
async def test_a_socket_is_accepted_at_once_and_its_snapshot_waits_for_the_one_before(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    ahead, behind, target = [await new_user(make_user) for _ in range(3)]
    first = sockets.make(ahead)
    assert (await first.connect(timeout=TIMEOUT))[0]
    second = sockets.make(behind)
    # The handshake is not held (daphne drops one not accepted within 5 s).
    assert (await second.connect(timeout=TIMEOUT))[0]
    await second.send_json_to({"type": "subscribe", "users": [wire_id(target)]})
    await assert_silent(second)
    assert (await subscribe(first, target))["type"] == "presence_state"
    answer = await receive(second)
    assert answer["type"] == "presence_state"
    assert list(answer["presences"]) == [str(wire_id(target))]


@pytest.mark.usefixtures("one_at_a_time")
async def test_a_socket_that_closes_before_subscribing_gives_its_place_back(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    first, second = await second_behind_first(sockets, make_user)
    await assert_silent(second)
    await sockets.close(first)
    assert (await receive(second))["type"] == "presence_state"


async def test_a_socket_that_never_subscribes_holds_its_place_for_opening_hold_only(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    admit_one_at_a_time(settings, hold=0.5)
    _, second = await second_behind_first(sockets, make_user)
    await assert_silent(second, seconds=0.2)
    assert (await receive(second))["type"] == "presence_state"


@pytest.mark.usefixtures("one_at_a_time")
async def test_a_freed_place_goes_to_the_user_holding_fewest_then_in_turn() -> None:
    held = await admission.admit(USER)
    mine = [asyncio.ensure_future(admission.admit(USER)) for _ in range(3)]
    await asyncio.sleep(0.05)
    theirs = asyncio.ensure_future(admission.admit(OTHER))
    await asyncio.sleep(0.05)
    # USER's sockets came first, but USER was served last: OTHER's turn.
    held.release()
    held = await asyncio.wait_for(theirs, TIMEOUT)
    assert not any(turn.done() for turn in mine)
    # A socket gone while it waited loses its turn, to its user's next one.
    mine[0].cancel()
    held.release()
    assert (await asyncio.wait_for(mine[1], TIMEOUT)).held
    assert mine[0].cancelled() and not mine[2].done()
    mine[1].result().release()
    (await asyncio.wait_for(mine[2], TIMEOUT)).release()
    assert admission.gate().in_use == 0 and admission.gate().held == {}


async def test_another_users_socket_opens_before_the_later_sockets_of_one_who_came_first(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    admit_one_at_a_time(settings, hold=30.0)
    flooder, other, target = [await new_user(make_user) for _ in range(3)]
    # The flooder's sockets, all accepted; the first holds the one place, none subscribes.
    floods = [sockets.make(flooder) for _ in range(4)]
    for flood in floods:
        assert (await flood.connect(timeout=TIMEOUT))[0]
    mine = sockets.make(other)
    assert (await mine.connect(timeout=TIMEOUT))[0]
    await mine.send_json_to({"type": "subscribe", "users": [wire_id(target)]})
    await assert_silent(mine)
    await sockets.close(floods[0])
    # Had the flooder's second socket been admitted, it would hold the place for 30 s.
    assert (await receive(mine))["type"] == "presence_state"
    # The flooder's three others, waiting, are recorded live (as waiting sockets are).
    assert len(await connections_in_redis(flooder)) == 3


async def test_one_user_holds_at_most_a_few_places_and_another_opens_beside_them(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    places = admission.PLACES_PER_USER
    settings.PRESENCE = {
        **settings.PRESENCE,
        "OPENINGS_AT_ONCE": places + 1,
        "OPENING_HOLD": 30.0,
    }
    flooder, other, target = [await new_user(make_user) for _ in range(3)]
    for _ in range(places + 3):
        assert (await sockets.make(flooder).connect(timeout=TIMEOUT))[0]

    def flooder_opened() -> int:
        return admission.gate().held.get(flooder.pk, 0)

    def all_places_taken() -> bool:
        # Its others wait, recorded live (as waiting sockets are).
        return flooder_opened() == places and admission.gate().queues.get(flooder.pk) is not None

    # Its first sockets took their places ...
    assert await eventually(all_places_taken)
    # ... and another user's socket opens beside them, not after the flooder's next ones.
    mine = sockets.make(other)
    assert (await mine.connect(timeout=TIMEOUT))[0]
    await mine.send_json_to({"type": "subscribe", "users": [wire_id(target)]})
    assert (await receive(mine))["type"] == "presence_state"
    assert flooder_opened() == places


async def test_a_socket_the_store_refuses_gives_its_place_back_at_once(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    admit_one_at_a_time(settings, hold=30.0, MAX_CONNECTIONS_PER_USER=1)
    crowded, other, target = [await new_user(make_user) for _ in range(3)]
    store = get_store()
    # The user's one connection is another process's: the store refuses a second one.
    opened = await store.arun(store.plans.connection(crowded.pk, "open", time.time(), "elsewhere"))
    assert opened is not None and not opened.refused
    # Refused; its client never answers the close (nor does the server see the socket end).
    assert await refused(sockets.make(crowded))
    mine = sockets.make(other)
    assert (await mine.connect(timeout=TIMEOUT))[0]
    await mine.send_json_to({"type": "subscribe", "users": [wire_id(target)]})
    assert (await receive(mine))["type"] == "presence_state"


async def test_past_max_connections_per_user_in_the_process_a_socket_is_refused_before_waiting(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    admit_one_at_a_time(settings, hold=30.0, MAX_CONNECTIONS_PER_USER=2)
    holder, user = [await new_user(make_user) for _ in range(2)]
    first = sockets.make(holder)
    assert (await first.connect(timeout=TIMEOUT))[0]  # holds the one place
    waiting = [sockets.make(user) for _ in range(2)]
    for socket in waiting:
        assert (await socket.connect(timeout=TIMEOUT))[0]
    # A third socket of the user here: refused at once, though no place is free.
    assert await refused(sockets.make(user))
    # The two waiting are counted, not refused: they open in turn.
    await sockets.close(first)
    for socket in waiting:
        assert await subscribe(socket) == state({})
    assert len(await connections_in_redis(user)) == 2


async def test_sockets_that_only_join_rooms_give_their_places_back_with_their_room_state(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    # Two places, held an hour each unless given back: the clock never reaches OPENING_HOLD
    # here, so every socket after the first two opens only if a room_state frees a place.
    settings.PRESENCE = {
        **settings.PRESENCE,
        "ROOMS": {"lobby": None},
        "OPENINGS_AT_ONCE": 2,
        "OPENING_HOLD": 3600.0,
    }
    users = [await new_user(make_user) for _ in range(7)]
    joiners = [sockets.make(user) for user in users]
    for joiner in joiners:
        assert (await joiner.connect(timeout=TIMEOUT))[0]
    # A live event's page: its sockets join the room straight after opening, never subscribe.
    for joiner in joiners:
        await joiner.send_json_to({"type": "join", "room": "lobby:live", "meta": None})
    answers = [await receive(joiner) for joiner in joiners]
    assert [answer["type"] for answer in answers] == ["room_state"] * len(joiners)
    assert admission.gate().in_use == 0
    # A join that is refused answers the opening too (an error, not a place held).
    late = sockets.make(await new_user(make_user))
    assert (await late.connect(timeout=TIMEOUT))[0]
    await late.send_json_to({"type": "join", "room": "nowhere:1", "meta": None})
    assert (await receive(late))["type"] == "error"
    assert admission.gate().in_use == 0


async def test_a_socket_that_joins_a_room_gives_its_place_back_while_its_join_is_under_way(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A live event's page: the join goes in its room's batch, whose work grows little with each
    # joiner more; the next socket opens meanwhile (held until the room_state, each batch was
    # as small as the places: a window's delivery to every viewer each).
    admit_one_at_a_time(settings, hold=3600.0, ROOMS={"lobby": None})
    under_way = asyncio.Event()
    go_on = asyncio.Event()
    join = JoinBatches.join

    async def slow_join(self: JoinBatches, room: Any, joining: Any) -> Any:
        under_way.set()
        await go_on.wait()
        return await join(self, room, joining)

    monkeypatch.setattr(JoinBatches, "join", slow_join)
    first, second = await second_behind_first(sockets, make_user)
    await first.send_json_to({"type": "join", "room": "lobby:live", "meta": None})
    await asyncio.wait_for(under_way.wait(), TIMEOUT)
    assert await receive(second) == state({})  # opened while the join waits in its batch
    go_on.set()
    assert (await receive(first))["type"] == "room_state"
    assert admission.gate().in_use == 0


@pytest.mark.usefixtures("one_at_a_time")
async def test_a_socket_waiting_for_its_turn_is_recorded_live_and_signed_off_if_it_goes(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    # A reconnect storm: the user's previous connection (on the process that died) expires
    # CONNECTION_TTL after its last heartbeat; a socket recorded only at its turn let its user
    # go offline and come back meanwhile, announced to every watcher.
    _, second = await second_behind_first(sockets, make_user)
    waiter = second.scope["user"]

    async def recorded() -> int:
        return len(await connections_in_redis(waiter))

    assert await eventually(lambda: recorded())
    await assert_silent(second, seconds=0.1)  # still waiting: nothing answered yet
    assert admission.gate().in_use == 1
    # Gone before its turn (its handler cancelled, as daphne does): signed off all the same.
    sockets.opened.remove(second)
    await second.disconnect(timeout=0.1)
    assert await recorded() == 0


async def test_a_socket_waiting_for_its_turn_writes_its_heartbeats(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    admit_one_at_a_time(settings, hold=30.0, HEARTBEAT_INTERVAL=1, CONNECTION_TTL=2)
    _, second = await second_behind_first(sockets, make_user)
    waiter = second.scope["user"]
    first_seen: list[str] = []

    async def recorded() -> bool:
        first_seen[:] = await connections_in_redis(waiter)
        return len(first_seen) == 1

    assert await eventually(recorded)

    async def beaten() -> bool:
        now = await connections_in_redis(waiter)
        return len(now) == 1 and now != first_seen

    # Its record does not expire while it waits longer than CONNECTION_TTL.
    assert await eventually(beaten, timeout=3.0)


async def test_a_socket_the_store_refuses_while_it_would_wait_is_closed_before_its_turn(
    sockets: Sockets, make_user: Callable[..., Any], settings: Any
) -> None:
    admit_one_at_a_time(settings, hold=30.0, MAX_CONNECTIONS_PER_USER=1)
    holder, crowded = [await new_user(make_user) for _ in range(2)]
    assert (await sockets.make(holder).connect(timeout=TIMEOUT))[0]  # holds the one place
    store = get_store()
    opened = await store.arun(store.plans.connection(crowded.pk, "open", time.time(), "elsewhere"))
    assert opened is not None and not opened.refused
    # Its record before waiting is refused: closed at once, not after the 30 s of the holder.
    assert await refused(sockets.make(crowded))
    assert len(await connections_in_redis(crowded)) == 1  # the other process's only
    assert admission.gate().queues == {}


@pytest.mark.usefixtures("one_at_a_time")
async def test_joins_gather_only_while_sockets_wait_for_their_turn(
    gather_pauses: GatherPauses,
) -> None:
    paused, resume = gather_pauses.asked, gather_pauses.resume
    await asyncio.wait_for(admission.gather_while_waiting(), TIMEOUT)
    assert paused == []  # no socket waits: no delay
    slot = await admission.admit(USER)
    await asyncio.wait_for(admission.gather_while_waiting(), TIMEOUT)
    assert paused == []  # one opening under way, none waiting
    waiting = asyncio.ensure_future(admission.admit(OTHER))
    await asyncio.sleep(0)
    assert admission.openings_waiting()
    gathering = asyncio.ensure_future(admission.gather_while_waiting())
    await asyncio.sleep(0)
    assert paused == [admission.GATHER_WHILE_WAITING] and not gathering.done()
    resume.set()
    await asyncio.wait_for(gathering, TIMEOUT)
    slot.release()
    (await asyncio.wait_for(waiting, TIMEOUT)).release()
    assert not admission.openings_waiting()
    resume.clear()
    await asyncio.wait_for(admission.gather_while_waiting(), TIMEOUT)
    assert paused == [admission.GATHER_WHILE_WAITING]


async def test_one_users_sockets_past_their_places_do_not_make_joins_gather(
    gather_pauses: GatherPauses,
) -> None:
    # Places free for others: one account's tabs waiting for its own places are no storm.
    slots = [await admission.admit(USER) for _ in range(admission.PLACES_PER_USER)]
    waiting = asyncio.ensure_future(admission.admit(USER))
    await asyncio.sleep(0)
    assert not waiting.done()
    assert not admission.openings_waiting()
    await asyncio.wait_for(admission.gather_while_waiting(), TIMEOUT)
    assert gather_pauses.asked == []
    slots[0].release()
    for slot in [*slots[1:], await asyncio.wait_for(waiting, TIMEOUT)]:
        slot.release()
