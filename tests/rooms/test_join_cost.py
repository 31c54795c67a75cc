"""What a join costs and is charged (issue 34, item 3): a viewer who may see few members makes
a room's read go down to 32 x ROOM_LIST_LIMIT members; such a join counts against RATE_LIMIT by
the members it resolved, a join again that only replaces the meta is answered without reading
the room, and no member's facts or live state are read twice in one read.

Real Redis, real channel layer, WebsocketCommunicator (tests/live/sockets.py)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from presence import api, relations
from presence.models import PrivacySettings
from presence.store import get_store, merge
from tests.live.sockets import BASE, Sockets, new_user, receive
from tests.live.sockets import sockets as sockets
from tests.rooms.rules import ROOMS

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
]

BIG = "post:big"
SMALL = "post:small"
#: the widest read at the default ROOM_LIST_LIMIT (100): 32 x 100 members
WIDEST = 3200
#: a window long enough that no frame of the test leaves it, however slow the machine
SETTINGS = {**BASE, "ROOMS": ROOMS, "CONNECTION_TTL": 3600, "RATE_LIMIT": (60, 3600)}


@pytest.fixture(autouse=True)
def _room_settings(settings: Any) -> None:
    settings.PRESENCE = dict(SETTINGS)


def fill(room: str, count: int, prefix: str) -> list[Any]:
    """``count`` users at default privacy (their contacts see them online: a stranger sees
    nobody), each in ``room`` with one connection, through the store's join plan."""
    model = get_user_model()
    model.objects.bulk_create([model(username=f"{prefix}{i}", password="!") for i in range(count)])
    users = list(model.objects.filter(username__startswith=prefix).order_by("date_joined", "pk"))
    store = get_store()
    now = time.time()
    for start in range(0, count, 500):
        plans = [
            store.plans.join_room(room, user.pk, f"c{n}", now + n / 1000)
            for n, user in enumerate(users[start : start + 500], start)
        ]
        assert all(write is not None for write in store.run(merge(plans)))
    return users


async def join(socket: Any, room: str, meta: Any = None) -> dict[str, Any]:
    await socket.send_json_to({"type": "join", "room": room, "meta": meta})
    return await receive(socket)


async def join_and_leave_until_closed(socket: Any, room: str, rounds: int) -> int:
    """Join and leave ``room`` up to ``rounds`` times: the joins answered before the connection
    was closed (the round it was closed in not counted)."""
    for n in range(rounds):
        await socket.send_json_to({"type": "join", "room": room, "meta": None})
        answer = await socket.receive_output(timeout=30)
        if answer["type"] == "websocket.close":
            assert answer["code"] == 4429
            return n
        await socket.send_json_to({"type": "leave", "room": room})
    return rounds


async def test_joins_of_a_big_room_that_resolve_many_members_are_charged(
    sockets: Sockets, make_user: Callable
) -> None:
    """A stranger's join of a room of thousands resolves up to 3,200 members: it counts 16
    frames (one per 200), so a connection joining and leaving it is closed (4429) after a few
    rounds, where the same frames on a small room stay far within RATE_LIMIT (60 frames)."""
    await sync_to_async(fill)(BIG, WIDEST + 300, "big")
    await sync_to_async(fill)(SMALL, 3, "small")
    stranger = await new_user(make_user)

    cheap = await sockets.open(stranger)
    assert await join_and_leave_until_closed(cheap, SMALL, 25) == 25  # 50 frames of 60

    costly = await sockets.open(stranger)
    state = await join(costly, BIG)
    assert list(state["members"]) == [str(stranger.pk)]  # sees nobody else
    assert (state["others"], state["count"]) == (WIDEST + 300, WIDEST + 301)
    await costly.send_json_to({"type": "leave", "room": BIG})
    # 17 frames per round (a join of 16, a leave): the fourth round, counting the one above,
    # fills the 60, and its leave is refused.
    assert await join_and_leave_until_closed(costly, BIG, 25) <= 3


class Loads:
    """Every id whose privacy facts (``relations.load``, or ``relations.aload_pairs``'s
    targets: a batch of joins') or live state (``read_recent``) is read, and every read of a
    room's first members (``read_room``), from when :meth:`count` was called."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.facts: Counter[Any] = Counter()
        self.live: Counter[Any] = Counter()
        self.rooms: list[str] = []

    def count(self) -> None:
        load, aload = relations.load, relations.aload
        store = get_store()
        read_recent, read_room = store.plans.read_recent, store.plans.read_room

        def counted_load(viewer: Any, ids: Any) -> Any:
            self.facts.update(ids)
            return load(viewer, ids)

        async def counted_aload(viewer: Any, ids: Any) -> Any:
            self.facts.update(ids)
            return await aload(viewer, ids)

        aload_pairs = relations.aload_pairs

        async def counted_pairs(viewers: Any, ids: Any) -> Any:
            self.facts.update(ids)
            return await aload_pairs(viewers, ids)

        def counted_recent(ids: Any, *args: Any, **kwargs: Any) -> Any:
            self.live.update(ids)
            return read_recent(ids, *args, **kwargs)

        def counted_room(room: str, now: float, first: int, *args: Any) -> Any:
            if first:  # not a delivery's read of the changed members only
                self.rooms.append(room)
            return read_room(room, now, first, *args)

        self.monkeypatch.setattr(relations, "load", counted_load)
        self.monkeypatch.setattr(relations, "aload", counted_aload)
        self.monkeypatch.setattr(relations, "aload_pairs", counted_pairs)
        self.monkeypatch.setattr(store.plans, "read_recent", counted_recent)
        self.monkeypatch.setattr(store.plans, "read_room", counted_room)

    def twice(self) -> set[Any]:
        """The ids whose facts or live state were read more than once."""
        return {uid for counts in (self.facts, self.live) for uid, n in counts.items() if n > 1}


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Loads:
    return Loads(monkeypatch)


async def test_joining_again_only_replaces_the_meta_without_reading_the_room(
    sockets: Sockets, make_user: Callable, loads: Loads
) -> None:
    """A join of a room the connection is in (the typing-indicator recipe) writes the new meta
    and answers what the connection was sent, with the new meta: the room is not read again,
    no member resolved, and it counts one frame."""
    await sync_to_async(fill)(BIG, 500, "big")
    viewer = await new_user(make_user)
    socket = await sockets.open(viewer)
    first = await join(socket, BIG, {"typing": False})
    loads.count()
    for n in range(55):  # within RATE_LIMIT (60) only if each counts one frame
        again = await join(socket, BIG, {"typing": n % 2 == 1})
        assert again["type"] == "room_state", (n, again)
        assert again["members"][str(viewer.pk)]["meta"] == {"typing": n % 2 == 1}
        assert (again["others"], again["count"]) == (first["others"], first["count"])
    assert loads.rooms == []
    assert not loads.facts and not loads.live
    # A fresh read shows the meta written.
    state = await sync_to_async(api.room_presence)(BIG, viewer)
    assert state["members"][str(viewer.pk)]["meta"] == {"typing": False}


def hidden_room(room: str, count: int) -> list[Any]:
    """A room of ``count`` users, online, who hide from strangers (default privacy)."""
    users = fill(room, count, "hidden")
    for user in users:
        api.touch(user)
    return users


async def test_a_read_going_far_reads_each_members_facts_and_live_state_once(
    sockets: Sockets, make_user: Callable, settings: Any, loads: Loads
) -> None:
    """A viewer who may see few members makes the read widen (2, 8, 32, then 64 members at a
    list limit of 2: members joined without their privacy known are all candidates), each
    pass reading the first members again: no member's privacy facts or live state are read
    twice in one read, by the Python API or a socket's join."""
    settings.PRESENCE = {**SETTINGS, "ROOM_LIST_LIMIT": 2}
    members = await sync_to_async(hidden_room)(BIG, 70)
    shown = members[40]
    await sync_to_async(PrivacySettings.objects.create)(user=shown, online_visibility="everyone")
    viewer = await new_user(make_user)
    loads.count()
    state = await sync_to_async(api.room_presence)(BIG, viewer)
    assert list(state["members"]) == [str(shown.pk)]  # found on the fourth pass
    assert len(loads.rooms) == 4
    assert loads.twice() == set()
    assert set(loads.facts) == set(loads.live) == {m.pk for m in members[:64]}

    loads.facts.clear(), loads.live.clear(), loads.rooms.clear()
    socket = await sockets.open(viewer)
    state = await join(socket, BIG)
    assert list(state["members"]) == [str(viewer.pk), str(shown.pk)]
    assert len(loads.rooms) == 4
    assert loads.twice() == set()
    assert set(loads.facts) == set(loads.live) == {m.pk for m in members[:64]} | {viewer.pk}
