"""A socket's open stamps the change it makes in its own round trip (lua/connection.lua): a page
rendered before the open is told, and announcing it writes no stamp of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async

from presence import announce, lifecycle
from presence.store import get_store
from tests.live.test_lifecycle import Announcements, T, live_db

pytestmark = pytest.mark.cluster


async def stamped_since(user: Any, since: float) -> bool:
    """Whether the user's change stamp (or a schedule falling due) says "changed since"."""
    store = get_store()
    found = await store.arun(store.plans.changed_since([user.pk], 0, since, since))
    assert found is not None  # the stamps' epoch is kept
    return user.pk in found[1]


@pytest.fixture
def stamp_writes(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """The users of each stamp written apart from the write that made the change
    (announce.astamp_changes: a round trip of its own)."""
    writes: list[list[Any]] = []
    real = announce.astamp_changes

    async def counted(user_ids: list[Any], *args: Any) -> None:
        writes.append(list(user_ids))
        await real(user_ids, *args)

    monkeypatch.setattr(announce, "astamp_changes", counted)
    return writes


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_an_open_that_brings_its_user_online_stamps_it_in_its_own_round_trip(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    stamp_writes: list[list[Any]],
) -> None:
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    try:
        # A change of the user's first (a status): their shard's stamps are kept from then on.
        await announce.astamp_changes([user.pk])
        clock.shift(10)
        assert not await stamped_since(user, T + 5)
        stamp_writes.clear()
        opened = await lifecycle.aconnect(user, "c1")
        assert opened is not None and opened.stamped
        assert stamp_writes == []  # no second write for the stamp
        assert await stamped_since(user, T + 10)  # a page rendered before the open is told
        assert await news.received() == [user.pk]  # and the open is announced
        # A second socket on the same device changes nothing others see: no stamp, no news.
        clock.shift(10)
        again = await lifecycle.aconnect(user, "c2")
        assert again is not None and not again.stamped
        assert not await stamped_since(user, T + 15)
        assert await news.received() == []
        # Another device is news: stamped by the open too.
        clock.shift(10)
        mobile = await lifecycle.aconnect(user, "c3", "mobile")
        assert mobile is not None and mobile.stamped
        assert await stamped_since(user, T + 30)
        assert await news.received() == [user.pk]
        assert stamp_writes == []
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_heartbeats_and_closes_leave_stamping_to_the_announcement(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    stamp_writes: list[list[Any]],
) -> None:
    user = await sync_to_async(make_user)()
    try:
        came = await lifecycle.aheartbeat(user, "c1")  # a beat of a socket unknown here
        assert came is not None and not came.stamped
        assert stamp_writes == [[user.pk]]  # news, stamped before it is announced
        assert await stamped_since(user, T)
        clock.shift(10)
        await lifecycle.aheartbeat(user, "c2", "mobile")
        stamp_writes.clear()
        left = await lifecycle.adisconnect(user, "c2")  # the mobile device leaves: news
        assert left is not None and not left.stamped
        assert stamp_writes == [[user.pk]]
        assert await stamped_since(user, T + 10)
    finally:
        await get_store().aclose()
