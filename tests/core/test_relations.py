"""presence.relations: privacy facts of many targets for one viewer, in one query."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.db import connection, models
from django.db.models.signals import post_init
from django.test.utils import CaptureQueriesContext, isolate_apps

from presence import domain, relations
from presence.models import (
    Block,
    Contact,
    LastSeen,
    PrivacyException,
    PrivacySettings,
    UserStatus,
)
from presence.relations import pairs as pairs_module
from tests.ids import missing_id

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.uuid_site,
]


def test_relation_of_each_kind_in_one_query(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    contact, close, one_way, stranger, blocker, blocked = (make_user() for _ in range(6))
    Contact.objects.create(owner=contact, contact=viewer)
    Contact.objects.create(owner=close, contact=viewer, close_friend=True)
    Contact.objects.create(owner=viewer, contact=one_way)  # the viewer's choice grants nothing
    Contact.objects.create(owner=blocker, contact=viewer, close_friend=True)
    Block.objects.create(blocker=blocker, blocked=viewer)
    Contact.objects.create(owner=blocked, contact=viewer, close_friend=True)
    Block.objects.create(blocker=viewer, blocked=blocked)
    # Noise: relations between other users must not leak into the viewer's.
    Contact.objects.create(owner=stranger, contact=contact, close_friend=True)
    Block.objects.create(blocker=stranger, blocked=contact)

    targets = [viewer, contact, close, one_way, stranger, blocker, blocked]
    with CaptureQueriesContext(connection) as queries:
        facts = relations.load(viewer, [t.pk for t in targets])
    assert len(queries) == 1
    relation = {pk: rel for pk, (rel, _) in facts.items()}
    assert relation == {
        viewer.pk: domain.SELF,
        contact.pk: domain.Relation(is_contact=True),
        close.pk: domain.Relation(is_contact=True, is_close_friend=True),
        one_way.pk: domain.STRANGER,
        stranger.pk: domain.STRANGER,
        blocker.pk: domain.Relation(is_contact=True, is_close_friend=True, blocked=True),
        blocked.pk: domain.Relation(is_contact=True, is_close_friend=True, blocked=True),
    }


@pytest.mark.parametrize("count", [1, 200])
def test_one_query_whatever_the_number_of_targets(
    count: int, make_user: Callable[..., Any]
) -> None:
    viewer = make_user()
    targets = [make_user() for _ in range(count)]
    with CaptureQueriesContext(connection) as queries:
        facts = relations.load(viewer, [t.pk for t in targets])
    assert len(queries) == 1
    assert set(facts) == {t.pk for t in targets}


def test_unknown_ids_are_left_out_and_nothing_costs_nothing(
    make_user: Callable[..., Any],
) -> None:
    viewer, target = make_user(), make_user()
    assert set(relations.load(viewer, [target.pk, 987654321])) == {target.pk}
    with CaptureQueriesContext(connection) as queries:
        assert relations.load(viewer, []) == {}
    assert len(queries) == 0


@pytest.mark.parametrize("viewer", [None, AnonymousUser()], ids=["none", "anonymous-user"])
def test_anonymous_viewer_is_a_stranger(viewer: Any, make_user: Callable[..., Any]) -> None:
    target = make_user()
    other = make_user()
    Contact.objects.create(owner=target, contact=other, close_friend=True)
    facts = relations.load(viewer, [target.pk])
    assert facts[target.pk][0] == domain.STRANGER


def test_choices_default_without_rows(make_user: Callable[..., Any]) -> None:
    target = make_user()
    _, choices = relations.load(None, [target.pk])[target.pk]
    assert choices == domain.Choices(
        online_visibility=domain.Visibility.CONTACTS,
        last_seen_visibility=domain.Visibility.CONTACTS,
        activity_visibility=domain.Visibility.CONTACTS,
        invisible=False,
        dnd=False,
    )


def test_choices_from_rows(make_user: Callable[..., Any]) -> None:
    target = make_user()
    expires = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    seen = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    PrivacySettings.objects.create(
        user=target,
        online_visibility="everyone",
        last_seen_visibility="close_friends",
        activity_visibility="nobody",
        invisible=True,
    )
    UserStatus.objects.create(
        user=target, dnd=True, text="Away", emoji="🌴", activity="", expires_at=expires
    )
    LastSeen.objects.create(user=target, seen_at=seen)
    _, choices = relations.load(None, [target.pk])[target.pk]
    assert choices == domain.Choices(
        online_visibility=domain.Visibility.EVERYONE,
        last_seen_visibility=domain.Visibility.CLOSE_FRIENDS,
        activity_visibility=domain.Visibility.NOBODY,
        invisible=True,
        dnd=True,
        text="Away",
        emoji="🌴",
        activity=None,  # empty means none
        expires_at=expires.timestamp(),
        persisted_last_seen=seen.timestamp(),
    )


def test_friends_are_mutual_contacts(make_user: Callable[..., Any]) -> None:
    user, mutual, follows_me, i_follow, blocked_friend, blocking_friend = (
        make_user() for _ in range(6)
    )
    for friend in (mutual, blocked_friend, blocking_friend):
        Contact.objects.create(owner=user, contact=friend)
        Contact.objects.create(owner=friend, contact=user)
    Contact.objects.create(owner=follows_me, contact=user)
    Contact.objects.create(owner=user, contact=i_follow)
    Block.objects.create(blocker=user, blocked=blocked_friend)
    Block.objects.create(blocker=blocking_friend, blocked=user)
    with CaptureQueriesContext(connection) as queries:
        ids = relations.friend_ids(user)
    assert len(queries) == 1
    # A block either way leaves the friend out of every list of friends (the contacts stay:
    # an unblock brings them back).
    assert sorted(ids) == [mutual.pk]
    assert sorted(async_to_sync(relations.afriend_ids)(user)) == sorted(ids)
    Block.objects.filter(blocked=blocked_friend).delete()
    assert sorted(relations.friend_ids(user)) == sorted([mutual.pk, blocked_friend.pk])


def test_anonymous_has_no_friends() -> None:
    with CaptureQueriesContext(connection) as queries:
        assert relations.friend_ids(None) == []
        assert relations.friend_ids(AnonymousUser()) == []
    assert len(queries) == 0


def test_async_load_matches_sync(make_user: Callable[..., Any]) -> None:
    viewer, contact, stranger = make_user(), make_user(), make_user()
    Contact.objects.create(owner=contact, contact=viewer, close_friend=True)
    PrivacySettings.objects.create(user=stranger, online_visibility="everyone")
    ids = [viewer.pk, contact.pk, stranger.pk, 987654321]
    assert async_to_sync(relations.aload)(viewer, ids) == relations.load(viewer, ids)
    assert async_to_sync(relations.aload)(viewer, []) == {}


def test_load_with_users_reads_the_facts_of_load_and_the_users_in_one_query(
    make_user: Callable[..., Any],
) -> None:
    viewer, contact, close, stranger, blocker = (make_user() for _ in range(5))
    Contact.objects.create(owner=contact, contact=viewer)
    Contact.objects.create(owner=close, contact=viewer, close_friend=True)
    Contact.objects.create(owner=blocker, contact=viewer, close_friend=True)
    Block.objects.create(blocker=blocker, blocked=viewer)
    PrivacySettings.objects.create(user=stranger, online_visibility="everyone", invisible=True)
    UserStatus.objects.create(user=close, dnd=True, text="away")
    LastSeen.objects.create(user=contact, seen_at=datetime(2030, 1, 2, tzinfo=UTC))
    users = [viewer, contact, close, stranger, blocker]
    ids = [u.pk for u in users] + [missing_id()]
    with CaptureQueriesContext(connection) as queries:
        found = relations.load_with_users(viewer, ids)
        built = found.users([blocker.pk, missing_id(), contact.pk, viewer.pk])
    assert len(queries) == 1
    assert found.facts == relations.load(viewer, ids)
    # As the manager loads them, in the order asked; an id not read is left out.
    loaded = get_user_model()._default_manager.in_bulk([blocker.pk, contact.pk, viewer.pk])
    assert [u.pk for u in built] == [blocker.pk, contact.pk, viewer.pk]
    for user in built:
        assert _fields(user) == _fields(loaded[user.pk])
        assert not user._state.adding and user._state.db == "default"
        # Whatever else the manager's loading sets up (a later Django may add to it).
        assert vars(user._state) == vars(loaded[user.pk]._state)
    assert async_to_sync(relations.aload_with_users)(viewer, ids).facts == found.facts
    assert relations.load_with_users(None, ids).facts == relations.load(None, ids)
    with CaptureQueriesContext(connection) as queries:
        assert relations.load_with_users(viewer, []).users([viewer.pk]) == []
    assert len(queries) == 0


def test_users_are_built_through_from_db_when_a_receiver_listens_to_their_init(
    make_user: Callable[..., Any],
) -> None:
    # Users are built without Model.__init__ only where nothing could tell the difference: a
    # post_init receiver (a field tracker, say) must see every user built.
    viewer, friend = make_user(), make_user()
    seen: list[Any] = []

    def receiver(sender: Any, instance: Any, **kwargs: Any) -> None:
        seen.append(instance)

    post_init.connect(receiver, sender=get_user_model())
    try:
        built = relations.load_with_users(viewer, [friend.pk]).users([friend.pk])
    finally:
        post_init.disconnect(receiver, sender=get_user_model())
    assert seen == built and [u.pk for u in built] == [friend.pk]
    assert not built[0]._state.adding and built[0]._state.db == "default"
    # Without the receiver, the same user, built by hand.
    again = relations.load_with_users(viewer, [friend.pk]).users([friend.pk])
    assert _fields(again[0]) == _fields(built[0]) and not again[0]._state.adding


@isolate_apps("presence")
def test_a_model_with_its_own_from_db_or_a_field_descriptor_is_built_by_from_db() -> None:
    class OwnFromDb(models.Model):  # noqa: DJ008
        class Meta:
            app_label = "presence"

        @classmethod
        def from_db(cls, db: Any, field_names: Any, values: Any) -> Any:
            return super().from_db(db, field_names, values)

    class Descriptor:
        def __get__(self, instance: Any, owner: Any) -> Any:
            return self

        def __set__(self, instance: Any, value: Any) -> None:
            pass

    class DescriptorField(models.IntegerField):
        def contribute_to_class(self, cls: Any, name: str, private_only: bool = False) -> None:
            super().contribute_to_class(cls, name, private_only)
            setattr(cls, self.attname, Descriptor())

    class WithDescriptor(models.Model):  # noqa: DJ008
        counter = DescriptorField()

        class Meta:
            app_label = "presence"

    class Plain(models.Model):  # noqa: DJ008
        counter = models.IntegerField()

        class Meta:
            app_label = "presence"

    assert relations.row_builder(OwnFromDb) == OwnFromDb.from_db
    assert relations.row_builder(WithDescriptor) == WithDescriptor.from_db
    built = relations.row_builder(Plain)("default", ("id", "counter"), [7, 3])
    assert type(built) is Plain and (built.pk, built.counter) == (7, 3)
    assert not built._state.adding and built._state.db == "default"


def _fields(user: Any) -> dict[str, Any]:
    return {f.attname: getattr(user, f.attname) for f in user._meta.concrete_fields}


# --- many viewers at once (the live fan-out) ----------------------------------------------------


def test_pair_facts_relation_of_each_kind() -> None:
    viewer, contact, close, stranger, blocker, blocked = 1, 2, 3, 4, 5, 6
    facts = relations.PairFacts(
        choices={},
        # (target, viewer) -> close friend: the target has the viewer among its contacts
        contacts={
            (contact, viewer): False,
            (close, viewer): True,
            (blocker, viewer): True,
            (blocked, viewer): True,
            (viewer, stranger): True,  # the viewer's own choice grants the viewer nothing
        },
        blocks={frozenset((blocker, viewer)), frozenset((viewer, blocked))},
    )
    assert facts.relation(viewer, viewer) == domain.SELF
    assert facts.relation(viewer, contact) == domain.Relation(is_contact=True)
    assert facts.relation(viewer, close) == domain.Relation(is_contact=True, is_close_friend=True)
    assert facts.relation(viewer, stranger) == domain.STRANGER
    for target in (blocker, blocked):
        assert facts.relation(viewer, target) == domain.Relation(
            is_contact=True, is_close_friend=True, blocked=True
        )
    assert facts.relation(None, close) == domain.STRANGER
    assert facts.relation(None, viewer) == domain.STRANGER
    # A block between others does not touch the viewer's relations.
    assert facts.relation(stranger, viewer) == domain.Relation(
        is_contact=True, is_close_friend=True
    )


def _mixed_graph(make_user: Callable[..., Any]) -> list[Any]:
    """Seven users with contacts one way and both ways, close friends, blocks in either
    direction (some between contacts), and varied choices."""
    a, b, c, d, e, f, g = users = [make_user() for _ in range(7)]
    for owner, contact, close in [
        (a, b, False),
        (b, a, True),
        (a, c, True),
        (c, d, False),
        (d, c, False),
        (e, a, True),
        (f, a, False),
        (f, b, True),
        (g, f, True),
        (b, g, False),
    ]:
        Contact.objects.create(owner=owner, contact=contact, close_friend=close)
    for blocker, blocked in [(e, a), (a, f), (c, g), (g, c)]:
        Block.objects.create(blocker=blocker, blocked=blocked)
    PrivacySettings.objects.create(user=a, online_visibility="everyone", invisible=True)
    PrivacySettings.objects.create(user=c, last_seen_visibility="close_friends")
    UserStatus.objects.create(user=b, dnd=True, text="Busy", emoji="📵")
    UserStatus.objects.create(
        user=d, activity="Travelling", expires_at=datetime(2030, 1, 1, tzinfo=UTC)
    )
    LastSeen.objects.create(user=e, seen_at=datetime(2025, 1, 1, tzinfo=UTC))
    return users


@pytest.mark.parametrize("ids_in_query", [0, 1000], ids=["targets-side", "viewers-named"])
def test_pairs_give_the_relations_and_choices_of_load_for_every_pair(
    ids_in_query: int, make_user: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both ways of reading the pairs (the viewers named in the query, or the targets' whole
    # contact lists past the ids a statement takes) give the relations load gives.
    monkeypatch.setattr(pairs_module, "IDS_IN_QUERY", ids_in_query)  # where it is read
    users = _mixed_graph(make_user)
    targets = [u.pk for u in users] + [987654321]
    viewers = [u.pk for u in users]
    pairs = relations.load_pairs(viewers, targets)
    async_pairs = async_to_sync(relations.aload_pairs)(viewers, targets)
    assert async_pairs == pairs
    assert set(pairs.choices) == {u.pk for u in users}  # the id of no user is left out
    seen_kinds = set()
    for viewer in [*users, None]:
        facts = relations.load(viewer, targets)
        assert set(facts) == set(pairs.choices)
        for target, (relation, choices) in facts.items():
            viewer_pk = viewer.pk if viewer is not None else None
            assert pairs.relation(viewer_pk, target) == relation, (viewer_pk, target)
            assert pairs.choices[target] == choices
            seen_kinds.add(relation)
    # The graph is not trivial: every kind of relation occurs.
    assert seen_kinds == {
        domain.SELF,
        domain.STRANGER,
        domain.Relation(is_contact=True),
        domain.Relation(is_contact=True, is_close_friend=True),
        domain.Relation(blocked=True),
        domain.Relation(is_contact=True, blocked=True),
        domain.Relation(is_contact=True, is_close_friend=True, blocked=True),
    }


@pytest.mark.parametrize("viewer_count", [1, 40, 1200])
def test_pairs_cost_three_queries_whatever_the_number_of_viewers(
    viewer_count: int, make_user: Callable[..., Any], django_assert_num_queries: Any
) -> None:
    targets = [make_user() for _ in range(3)]
    viewers = [make_user() for _ in range(viewer_count)]
    for viewer in viewers:
        Contact.objects.create(owner=targets[0], contact=viewer)
        Block.objects.create(blocker=viewer, blocked=targets[1])
    # Contacts who are not viewers are not read: the query names the viewers.
    for _ in range(5):
        Contact.objects.create(owner=targets[0], contact=make_user())
    target_ids = [t.pk for t in targets]
    viewer_ids = [v.pk for v in viewers]
    with django_assert_num_queries(3):
        pairs = relations.load_pairs(viewer_ids, target_ids)
    with django_assert_num_queries(3):
        assert async_to_sync(relations.aload_pairs)(viewer_ids, target_ids) == pairs
    assert len(pairs.contacts) == len(pairs.blocks) == viewer_count


def test_pairs_of_no_target_cost_nothing(
    make_user: Callable[..., Any], django_assert_num_queries: Any
) -> None:
    viewer = make_user()
    with django_assert_num_queries(0):
        assert relations.load_pairs([viewer.pk], []) == relations.PairFacts({}, {}, set())
        assert async_to_sync(relations.aload_pairs)([viewer.pk], []) == relations.PairFacts(
            {}, {}, set()
        )


def test_pairs_without_viewers_still_give_the_choices(make_user: Callable[..., Any]) -> None:
    target = make_user()
    UserStatus.objects.create(user=target, text="Hello")
    pairs = relations.load_pairs([], [target.pk])
    assert pairs == relations.PairFacts({target.pk: domain.Choices(text="Hello")}, {}, set())


def test_ties_of_each_viewer_in_one_query(
    make_user: Callable[..., Any], django_assert_num_queries: Any
) -> None:
    """A viewer's ties (what a room's read lists first, leaves out and looks up): their
    contacts, whoever a block stands between either way, and whoever may show them more (a
    contact row naming them, an "always share" exception of the online status; not a
    refusing one, nor one of another setting), and the owners of any exception naming them
    (whatever they show the viewer may differ from a stranger's view). Many viewers' in one
    query, each the same as its own."""
    a, b, c, d, e, f, g = [make_user() for _ in range(7)]
    Contact.objects.create(owner=a, contact=b)
    Contact.objects.create(owner=a, contact=c, close_friend=True)
    Contact.objects.create(owner=d, contact=a)
    Contact.objects.create(owner=b, contact=c)
    Block.objects.create(blocker=a, blocked=e)
    Block.objects.create(blocker=f, blocked=a)
    PrivacyException.objects.create(owner=g, viewer=a, setting="online_visibility", allow=True)
    PrivacyException.objects.create(owner=e, viewer=a, setting="last_seen_visibility", allow=True)
    PrivacyException.objects.create(owner=c, viewer=b, setting="online_visibility", allow=False)
    expected = {
        a.pk: relations.Ties({b.pk, c.pk}, {e.pk, f.pk}, {d.pk, g.pk}, {g.pk, e.pk}),
        b.pk: relations.Ties({c.pk}, set(), {a.pk}, {c.pk}),
        c.pk: relations.Ties(set(), set(), {a.pk, b.pk}, set()),
        g.pk: relations.Ties(set(), set(), set(), set()),
    }
    with django_assert_num_queries(1):
        assert relations.ties_of(list(expected)) == expected
    for viewer, ties in expected.items():
        assert relations.viewer_ties(viewer) == ties
    assert relations.ties_of([]) == {}
