"""Last seen is persisted when a user's last connection ends: on a site of pages that is every
page view, so writes asked for while one is under way are committed together
(LastSeenManager.arecord_many). Each caller still returns once its own write is committed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from presence.models import LastSeen, LastSeenManager
from tests.clock import at
from tests.live.sockets import new_user

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
]


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each record_many call (one statement batch and one commit each)."""
    sizes: list[int] = []
    real = LastSeenManager.record_many

    def counting(self: LastSeenManager, seen: Any) -> int:
        sizes.append(len(seen))
        return real(self, seen)

    monkeypatch.setattr(LastSeenManager, "record_many", counting)
    return sizes


@sync_to_async
def rows() -> dict[Any, Any]:
    return dict(LastSeen.objects.values_list("user_id", "seen_at"))


async def test_a_lone_write_is_committed_before_it_returns(
    make_user: Callable[..., Any], commits: list[int]
) -> None:
    user = await new_user(make_user)
    assert await LastSeen.objects.arecord_many({user.pk: at(5).timestamp()}) == 1
    assert await rows() == {user.pk: at(5)}
    assert commits == [1]


async def test_writes_asked_for_together_are_committed_together(
    make_user: Callable[..., Any], commits: list[int]
) -> None:
    users = [await new_user(make_user) for _ in range(20)]
    results = await asyncio.gather(
        *(LastSeen.objects.arecord_many({u.pk: at(n).timestamp()}) for n, u in enumerate(users))
    )
    # The first goes alone; the 19 asked for meanwhile go in one statement and one commit.
    assert len(commits) <= 2 and sum(commits) == 20
    assert all(result >= 1 for result in results)
    assert await rows() == {u.pk: at(n) for n, u in enumerate(users)}
    # A time never moves backwards, also within one group.
    first = users[0]
    await asyncio.gather(
        LastSeen.objects.arecord_many({first.pk: at(30).timestamp()}),
        LastSeen.objects.arecord_many({first.pk: at(20).timestamp()}),
    )
    assert (await rows())[first.pk] == at(30)
