"""presence.relations: privacy facts of many targets for one viewer, in one query."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.test.utils import CaptureQueriesContext

from presence import domain, relations
from presence.models import Block, Contact, LastSeen, PrivacySettings, UserStatus

pytestmark = pytest.mark.django_db


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
    user, mutual, follows_me, i_follow, blocked_friend = (make_user() for _ in range(5))
    for friend in (mutual, blocked_friend):
        Contact.objects.create(owner=user, contact=friend)
        Contact.objects.create(owner=friend, contact=user)
    Contact.objects.create(owner=follows_me, contact=user)
    Contact.objects.create(owner=user, contact=i_follow)
    Block.objects.create(blocker=user, blocked=blocked_friend)
    with CaptureQueriesContext(connection) as queries:
        ids = relations.friend_ids(user)
    assert len(queries) == 1
    # A block does not unfriend; the privacy rules hide blocked friends everywhere.
    assert sorted(ids) == sorted([mutual.pk, blocked_friend.pk])
    assert sorted(async_to_sync(relations.afriend_ids)(user)) == sorted(ids)


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
