"""A page's read of a room takes what an earlier read resolved of members it has no tie with
(presence.rooms.shared.KnownMembers): every read answers exactly what a read with nothing kept
answers; the members a viewer is tied to (a contact either way, a block, a privacy exception
naming it), those with a change stamped since and, past MAX_AGE or under other settings, all of
them are read again; with reciprocal last seen nothing is kept.

Real Redis; time controlled (the change stamps are compared with it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from presence import api, relations
from presence.models import PrivacySettings
from presence.rooms import reading, shared
from presence.rooms.shared import KnownRooms
from tests.rooms.rules import ROOMS
from tests.rooms.test_join_batches import ROOM
from tests.rooms.test_shared_listings import excepting, read_afresh, scene

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

    @sync_to_async
    def hide(member: Any) -> None:
        privacy = PrivacySettings.objects.get(user=member)
        privacy.online_visibility = "nobody"
        privacy.save()

    await hide(members[2])  # a member read: its change is stamped, it alone is read again
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
