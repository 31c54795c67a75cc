"""What ending memberships costs (presence.feed.receivers): a transaction that ends many
memberships (a group deleted, a user deleted, a cascade) asks its members' watches again with
one query for the groups' names and one announcement once committed, whatever their number; a
group deleted asks every watcher of it by itself, so its memberships add nothing. A rolled-back
transaction announces nothing, and the next one announces its own memberships alone.

So do the contacts, blocks, privacy exceptions and privacy settings a transaction adds, changes
or removes, and the groups it deletes or renames: all asked about together once committed, in
at most three announcements (the ended memberships' members about their groups, the users
about all their watches, every watcher about the timelines named), whatever the rows' number.
Whether that commit hook is still pending is told without reading every hook of the
transaction on each row.

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
from presence.models import Block, Contact, PrivacyException, PrivacySettings

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.uuid_site]

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


def befriended(make_user: Callable[..., Any], username: str, others: int) -> tuple[Any, set[Any]]:
    """A user in every relation the feed rechecks for (contacts both ways, a block, an
    exception, a privacy setting and memberships) with ``others`` users, and the ids of
    everyone involved."""
    user = make_user(username)
    people = [make_user(f"{username}-{i}") for i in range(others)]
    Contact.objects.bulk_create([Contact(owner=user, contact=other) for other in people])
    Contact.objects.bulk_create([Contact(owner=other, contact=user) for other in people])
    Block.objects.bulk_create([Block(blocker=other, blocked=user) for other in people])
    PrivacyException.objects.bulk_create(
        [
            PrivacyException(owner=user, viewer=other, setting="online_visibility")
            for other in people
        ]
    )
    PrivacySettings.objects.create(user=user)
    group = Group.objects.create(name=f"{username}-group", slug=f"{username}-group")
    Membership.objects.create(group=group, user=user)
    return user, {user.pk, *(other.pk for other in people)}


def test_deleting_a_user_with_many_relations_asks_as_often_as_with_few(
    make_user: Callable[..., Any], announced: Announced
) -> None:
    few, few_ids = befriended(make_user, "few", 2)
    many, many_ids = befriended(make_user, "many", 30)
    few_key, many_key = feed.feed_key(few.pk), feed.feed_key(many.pk)
    few_queries, few_announced = deleting(few, announced)
    many_queries, many_announced = deleting(many, announced)
    # Everyone related asked about all their watches (the user's own group among them), and
    # every watcher of the user's timeline: two announcements each time.
    assert few_announced == [(sorted(few_ids, key=str), None), (None, [f"user:{few_key}"])]
    assert many_announced == [(sorted(many_ids, key=str), None), (None, [f"user:{many_key}"])]
    assert many_queries == few_queries, (few_queries, many_queries)


def test_the_relations_and_groups_a_transaction_changes_are_announced_together(
    make_user: Callable[..., Any], announced: Announced
) -> None:
    me = make_user("me")
    people = [make_user(f"p{i}") for i in range(12)]
    groups = [Group.objects.create(name=f"g{i}", slug=f"g{i}") for i in range(5)]
    announced.clear()
    with transaction.atomic():
        for other in people:
            Contact.objects.create(owner=me, contact=other)
            Block.objects.create(blocker=other, blocked=me)
            PrivacySettings.objects.create(user=other, activity_visibility="nobody")
        for group in groups[:3]:
            group.delete()
        groups[3].slug = "renamed"
        groups[3].save()
        assert announced == []  # not before the commit
    keys = sorted(f"user:{feed.feed_key(other.pk)}" for other in people)
    assert announced == [
        (sorted([me.pk, *(other.pk for other in people)], key=str), None),
        (None, sorted(["group:g0", "group:g1", "group:g2", "group:g3", *keys])),
    ]


def test_a_rolled_back_relation_is_not_announced_with_the_next_commit(
    make_user: Callable[..., Any], announced: Announced
) -> None:
    ann, bob, cy, dee = (make_user(name) for name in ("ann", "bob", "cy", "dee"))
    announced.clear()

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        Contact.objects.create(owner=ann, contact=bob)
        raise Undo
    assert announced == []
    with transaction.atomic():
        Contact.objects.create(owner=cy, contact=dee)
    assert announced == [(sorted([cy.pk, dee.pk], key=str), None)]

    # A savepoint rolled back: the rows before it (and its own, harmlessly) are announced
    # once with the transaction's; hooked inside it, the rows after it are announced alone.
    announced.clear()
    with transaction.atomic():
        Block.objects.create(blocker=ann, blocked=cy)
        with pytest.raises(Undo), transaction.atomic():
            Block.objects.create(blocker=bob, blocked=dee)
            raise Undo
        Block.objects.create(blocker=ann, blocked=dee)
    assert announced == [(sorted([ann.pk, bob.pk, cy.pk, dee.pk], key=str), None)]
    announced.clear()
    with transaction.atomic():
        with pytest.raises(Undo), transaction.atomic():
            Block.objects.create(blocker=bob, blocked=ann)
            raise Undo
        Block.objects.create(blocker=cy, blocked=bob)
    assert announced == [(sorted([bob.pk, cy.pk], key=str), None)]


class CountedHooks(list):  # type: ignore[type-arg]
    """A connection's commit hooks, counting how many of them are read."""

    reads = 0

    def __iter__(self) -> Any:
        for hook in super().__iter__():
            self.reads += 1
            yield hook

    def __getitem__(self, index: Any) -> Any:
        got = super().__getitem__(index)
        self.reads += len(got) if isinstance(index, slice) else 1
        return got


def hooks_read_ending(memberships: int, other_hooks: int, group: Group) -> int:
    """How many commit hooks are read to end ``memberships`` memberships in a transaction that
    has ``other_hooks`` hooks of its own already."""
    with transaction.atomic():
        for _ in range(other_hooks):
            transaction.on_commit(lambda: None)
        hooks = CountedHooks(connection.run_on_commit)
        connection.run_on_commit = hooks
        for user_id in range(memberships):
            receivers._membership_ended(user_id, group.pk, connection.alias)
        return hooks.reads


def test_a_membership_ended_does_not_read_every_commit_hook(announced: Announced) -> None:
    group = Group.objects.create(name="big", slug="big")
    alone = hooks_read_ending(200, 0, group)
    crowded = hooks_read_ending(200, 2000, group)
    # About one hook read a membership, however many hooks the transaction has: reading them
    # all made ending memberships quadratic (2,000 beside 20,000 hooks: 1.9 s).
    assert crowded == alone <= 2 * 200, (alone, crowded)
    assert announced == [(sorted(range(200), key=str), ["group:big"])] * 2
