"""What ending memberships costs (presence.feed.receivers): a transaction that ends many
memberships (a group deleted, a user deleted, a cascade) asks its members' watches again with
one query for the groups' names and one announcement once committed, whatever their number; a
group deleted asks every watcher of it by itself, so its memberships add nothing. A rolled-back
transaction announces nothing, and the next one announces its own memberships alone.

The announcements are counted on their way out (presence.feed.receivers.announce_recheck, which
still sends them through the real channel layer); the queries with CaptureQueriesContext."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from presence.feed import api as feed
from presence.feed import receivers
from presence.feed.models import Group, Membership

pytestmark = [pytest.mark.django_db(transaction=True)]

Announced = list[tuple[list[Any] | None, list[str] | None]]


@pytest.fixture
def announced(monkeypatch: pytest.MonkeyPatch) -> Announced:
    """Each recheck the feed's receivers announce: (users, feeds), then sent as ever."""
    sent: Announced = []
    announce = receivers.announce_recheck

    def recording(users: Any, feeds: Any = None) -> None:
        sent.append(
            (None if users is None else list(users), None if feeds is None else list(feeds))
        )
        announce(users, feeds)

    monkeypatch.setattr(receivers, "announce_recheck", recording)
    return sent


def group_of(make_user: Callable[..., Any], slug: str, members: int) -> Group:
    group = Group.objects.create(name=slug, slug=slug)
    users = [make_user(f"{slug}-{i}") for i in range(members)]
    Membership.objects.bulk_create([Membership(group=group, user=user) for user in users])
    return group


def deleting(what: Any, announced: Announced) -> tuple[int, Announced]:
    """The queries (until committed, the announcements' included) and the announcements of
    deleting ``what``."""
    announced.clear()
    with CaptureQueriesContext(connection) as queries:
        what.delete()
    return len(queries.captured_queries), list(announced)


def test_deleting_a_group_costs_the_same_whatever_its_members(
    make_user: Callable[..., Any], announced: Announced
) -> None:
    small = deleting(group_of(make_user, "small", 2), announced)
    big = deleting(group_of(make_user, "big", 60), announced)
    # Only the group's own: every watcher of its timeline asked again.
    assert small[1] == [(None, ["group:small"])]
    assert big[1] == [(None, ["group:big"])]
    assert big[0] == small[0], (small[0], big[0])


def test_deleting_a_user_in_many_groups_asks_once(
    make_user: Callable[..., Any], announced: Announced
) -> None:
    def member_of(username: str, groups: int) -> Any:
        user = make_user(username)
        made = [
            Group.objects.create(name=f"{username}{i}", slug=f"{username}{i}")
            for i in range(groups)
        ]
        Membership.objects.bulk_create([Membership(group=group, user=user) for group in made])
        return user

    few, many = member_of("few", 2), member_of("many", 40)
    few_id, many_id = few.pk, many.pk
    few_queries, few_announced = deleting(few, announced)
    many_queries, many_announced = deleting(many, announced)
    assert few_announced == [([few_id], ["group:few0", "group:few1"])]
    assert len(many_announced) == 1
    users, feeds = many_announced[0]
    assert users == [many_id] and sorted(feeds or []) == sorted(f"group:many{i}" for i in range(40))
    assert many_queries == few_queries, (few_queries, many_queries)


def test_a_rolled_back_membership_end_is_not_announced_with_the_next_commit(
    make_user: Callable[..., Any], announced: Announced
) -> None:
    group = group_of(make_user, "algebra", 2)
    first, second = (m.user for m in group.memberships.order_by("user__username"))

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        feed.leave(first, group)
        raise Undo
    assert announced == []
    assert group.memberships.filter(user=first).exists()
    with transaction.atomic():
        feed.leave(second, group)
    assert announced == [([second.pk], ["group:algebra"])]
    # Outside a transaction: at once, alone.
    announced.clear()
    feed.leave(first, group)
    assert announced == [([first.pk], ["group:algebra"])]
