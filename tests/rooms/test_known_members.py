"""A page's read of a room takes what an earlier read resolved of members it has no tie with
(presence.rooms.shared.KnownMembers): every read answers exactly what a read with nothing kept
answers; the members a viewer is tied to (a contact either way, a block, a privacy exception
naming it), those with a change stamped since and, past MAX_AGE or under other settings, all of
them are read again; with reciprocal last seen nothing is kept.

Real Redis; time controlled (the change stamps are compared with it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, transaction

from presence import api, relations
from presence.models import PrivacySettings
from presence.rooms import reading, shared
from presence.rooms.shared import KnownMembers, KnownRooms
from presence.store import get_store
from tests.rooms.rules import ROOMS
from tests.rooms.test_join_batches import ROOM
from tests.rooms.test_shared_listings import (
    aset_online_visibility,
    excepting,
    read_afresh,
    scene,
    set_online_visibility,
    shows_last_seen,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
]


@pytest.fixture(autouse=True)
def known(monkeypatch: pytest.MonkeyPatch) -> Iterator[KnownRooms]:
    """This test's own known members (the process's are other tests')."""
    rooms = KnownRooms()
    monkeypatch.setattr(reading, "KNOWN", rooms)
    yield rooms


class Reads:
    """The users whose facts each read of a room reads (its candidates)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: list[set[Any]] = []
        aload = relations.aload

        async def counted(viewer: Any, targets: Any) -> Any:
            if self.reads:  # (a read of its own: not counted)
                self.reads[-1].update(targets)
            return await aload(viewer, targets)

        monkeypatch.setattr(relations, "aload", counted)

    async def read(self, user: Any) -> tuple[set[Any], dict[str, Any]]:
        """Whose facts ``user``'s read read, and its answer (checked against a read with
        nothing kept, which keeps nothing either)."""
        self.reads.append(set())
        answer = await api.aroom_presence(ROOM, user)
        read = self.reads.pop()
        self.reads.append(set())
        try:
            fresh = await read_afresh(user)
        finally:
            self.reads.pop()
        assert _without_cursor(answer) == _without_cursor(fresh), user.username
        return read, answer


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    return Reads(monkeypatch)


def _without_cursor(answer: dict[str, Any]) -> dict[str, Any]:
    # A cursor is sealed with a fresh nonce each time: its place is paging's to test.
    return {key: value for key, value in answer.items() if key != "next"}


def pks(users: list[Any]) -> set[Any]:
    return {user.pk for user in users}


async def test_a_read_after_another_reads_only_the_members_its_viewer_is_tied_to(
    settings: Any, clock: Any, reads: Reads, known: KnownRooms
) -> None:
    members, joiners, others, _, _, first = await scene(settings, clock, 2, excepting)
    first -= pks([members[1]])  # invisible: no candidate, never read
    read, answer = await reads.read(others[0])
    assert first <= read and len(known) == 1  # resolved, and kept
    assert answer["members"]  # a stranger sees the public members

    read, _ = await reads.read(others[1])
    assert read == set()  # a stranger to all of them: nothing read again
    # Each joiner: the members it is tied to, read again (m0 never shows j9 its online
    # status, m2 always shows j10 its last seen, m3 and others have j0 among their contacts,
    # j1 follows m25); every other member as a stranger sees it. (m0 blocks j2: neither read
    # nor counted for j2, as before.)
    ties = {
        0: pks(members[3:15:2]),
        1: pks([members[25]]),
        9: pks([members[0]]),
        10: pks([members[2]]),
    }
    for n, joiner in enumerate(joiners):
        read, _ = await reads.read(joiner)
        assert read & first == ties.get(n, set()) & first, joiner.username


async def test_a_member_who_changed_is_read_again_and_an_old_or_other_settings_all(
    settings: Any, clock: Any, reads: Reads
) -> None:
    members, _, others, _, _, first = await scene(settings, clock, 6)
    first -= pks([members[1]])  # invisible: no candidate, never read
    await reads.read(others[0])
    assert (await reads.read(others[1]))[0] == set()

    # a member read: its change is stamped, it alone is read again
    await aset_online_visibility(members[2], "nobody")
    clock.shift(1)
    read, answer = await reads.read(others[2])
    assert read == pks([members[2]])
    assert str(members[2].pk) not in answer["members"]

    clock.shift(shared.MAX_AGE + 0.5)
    assert first <= (await reads.read(others[3]))[0]
    assert (await reads.read(others[4]))[0] == set()
    # Everyone shows their online status to everyone now: read again under the new settings.
    settings.PRESENCE = {
        "ROOMS": ROOMS,
        "ROOM_LIST_LIMIT": 5,
        "DEFAULT_PRIVACY": {"online_visibility": "everyone"},
    }
    read, answer = await reads.read(others[5])
    assert read and str(members[1].pk) not in answer["members"]  # (m1 is invisible)


async def test_with_reciprocal_last_seen_nothing_is_kept(
    settings: Any, clock: Any, reads: Reads, known: KnownRooms
) -> None:
    """A viewer's own choices then count for every member: no two viewers share them."""
    members, _, others, _, _, first = await scene(settings, clock, 2, RECIPROCAL_LAST_SEEN=True)
    first -= pks([members[1]])  # invisible: no candidate, never read
    await reads.read(others[0])
    assert first <= (await reads.read(others[1]))[0]
    assert len(known) == 0


async def test_nothing_is_taken_past_max_age_however_often_the_room_is_read(
    settings: Any, clock: Any, reads: Reads
) -> None:
    """Reads that each read something afresh (a viewer with contacts in the room) keep again,
    but as of the listing they took: a member's last seen, which its heartbeats move without a
    change stamped, is at most MAX_AGE (and a heartbeat's interval) behind, however long the
    room is read every 1.5 s."""
    members, joiners, others, *_ = await scene(settings, clock, 2, shows_last_seen)
    store = get_store()
    await reads.read(others[0])
    for _ in range(20):  # 30 s
        clock.shift(1.5)
        await store.arun(store.plans.connection(members[0].pk, "beat", time.time(), "c"))
        await api.aroom_presence(ROOM, joiners[0])
    shown = await api.aroom_presence(ROOM, others[1])
    fresh = await read_afresh(others[1])

    def last_seen(answer: dict[str, Any]) -> datetime:
        return datetime.fromisoformat(
            answer["members"][str(members[0].pk)]["presence"]["last_seen"]
        )

    behind = (last_seen(fresh) - last_seen(shown)).total_seconds()
    assert 0 <= behind <= shared.MAX_AGE + 1.5


async def test_what_was_kept_before_midnight_is_not_taken_after_it(
    settings: Any, clock: Any, reads: Reads
) -> None:
    """The approximate last seen turns at UTC midnight, which no change stamp follows."""
    midnight = datetime(2030, 1, 8, tzinfo=UTC)
    clock.move_to(midnight - timedelta(seconds=20))  # the scene takes 15 s of the clock
    _, _, others, *_ = await scene(settings, clock, 2, APPROXIMATE_LAST_SEEN=True)
    await reads.read(others[0])
    clock.shift(1)
    assert (await reads.read(others[1]))[0] == set()  # the same day: taken
    clock.shift(2.5)
    assert (await reads.read(others[0]))[0]  # past MAX_AGE: read again, and kept...
    assert datetime.fromtimestamp(time.time(), UTC) < midnight
    clock.shift(1.6)
    assert (await reads.read(others[1]))[0]  # ... but not taken after midnight


async def test_a_read_in_a_transaction_neither_takes_nor_keeps(
    settings: Any, clock: Any, known: KnownRooms
) -> None:
    """A read inside an atomic block may see the database as it was when it began: a change
    committed meanwhile, stamped before the read's time, would be kept as if it were not."""
    members, _, others, *_ = await scene(settings, clock, 2)
    hidden = str(members[2].pk)

    def hide() -> None:
        try:
            set_online_visibility(members[2], "nobody")
        finally:
            connection.close()

    @sync_to_async(thread_sensitive=False)
    def page_in_a_transaction() -> dict[str, Any]:
        try:
            with transaction.atomic():
                list(PrivacySettings.objects.all()[:1])  # the snapshot begins
                other = threading.Thread(target=hide)  # another request commits meanwhile
                other.start()
                other.join()
                clock.shift(3)  # past the clocks' slack
                return reading.room_presence(ROOM, others[0])
        finally:
            connection.close()

    await page_in_a_transaction()
    assert len(known) == 0
    answer = await api.aroom_presence(ROOM, others[1])
    assert hidden not in answer["members"]


def test_reads_begun_at_other_times_keep_the_latest_and_drop_nothing_newer() -> None:
    """Reads of one room run at once in a process's threads: the kept members are those of the
    read begun last, and a read begun before they were made neither takes nor drops them."""
    rooms = KnownRooms()

    def made(at: float) -> KnownMembers:
        return KnownMembers({}, {}, {}, at)

    rooms.keep(ROOM, made(1000.0))
    rooms.keep(ROOM, made(999.0))  # a read begun earlier, finishing later
    assert rooms.get(ROOM, 1000.5) == made(1000.0)
    assert rooms.get(ROOM, 999.5) is None  # begun before they were made
    assert rooms.get(ROOM, 1001.0) == made(1000.0)
    rooms.keep(ROOM, made(1001.0))
    assert rooms.get(ROOM, 1001.5) == made(1001.0)
    assert rooms.get(ROOM, 1001.0 + shared.MAX_AGE + 0.1) is None and len(rooms) == 0
