from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import IntegrityError, transaction

from presence.models import Block, Contact, LastSeen, PrivacySettings

T = 1_900_000_000.0


def when(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


class TestConstraints:
    def test_no_contact_with_oneself(self, make_user: Callable[..., Any]) -> None:
        user = make_user()
        with pytest.raises(IntegrityError), transaction.atomic():
            Contact.objects.create(owner=user, contact=user)
        assert not Contact.objects.exists()

    def test_no_duplicate_contact(self, make_user: Callable[..., Any]) -> None:
        a, b = make_user(), make_user()
        Contact.objects.create(owner=a, contact=b)
        with pytest.raises(IntegrityError), transaction.atomic():
            Contact.objects.create(owner=a, contact=b, close_friend=True)
        # the other direction is another contact, not a duplicate
        Contact.objects.create(owner=b, contact=a)
        assert Contact.objects.count() == 2

    def test_no_blocking_oneself_or_twice(self, make_user: Callable[..., Any]) -> None:
        a, b = make_user(), make_user()
        with pytest.raises(IntegrityError), transaction.atomic():
            Block.objects.create(blocker=a, blocked=a)
        Block.objects.create(blocker=a, blocked=b)
        with pytest.raises(IntegrityError), transaction.atomic():
            Block.objects.create(blocker=a, blocked=b)
        assert Block.objects.count() == 1

    def test_privacy_defaults(self, make_user: Callable[..., Any]) -> None:
        settings = PrivacySettings.objects.create(user=make_user())
        assert (
            settings.online_visibility,
            settings.last_seen_visibility,
            settings.activity_visibility,
            settings.invisible,
        ) == ("contacts", "contacts", "contacts", False)

    def test_deleting_a_user_deletes_their_rows(self, make_user: Callable[..., Any]) -> None:
        a, b = make_user(), make_user()
        Contact.objects.create(owner=a, contact=b)
        Block.objects.create(blocker=b, blocked=a)
        LastSeen.objects.record_many({a.pk: T})
        a.delete()
        assert not (Contact.objects.exists() or Block.objects.exists() or LastSeen.objects.exists())


class TestRecordMany:
    def test_inserts_and_moves_forward_only(self, make_user: Callable[..., Any]) -> None:
        a, b = make_user(), make_user()
        assert LastSeen.objects.record_many({a.pk: T, b.pk: T}) == 2
        LastSeen.objects.record_many({a.pk: T + 60, b.pk: T - 60})
        seen = dict(LastSeen.objects.values_list("user_id", "seen_at"))
        assert seen == {a.pk: when(T + 60), b.pk: when(T)}

    def test_skips_users_that_no_longer_exist(self, make_user: Callable[..., Any]) -> None:
        a = make_user()
        assert LastSeen.objects.record_many({a.pk: T, a.pk + 1000: T}) == 1
        assert list(LastSeen.objects.values_list("user_id", flat=True)) == [a.pk]

    def test_nothing_to_record_costs_nothing(
        self, django_assert_num_queries: Any, db: None
    ) -> None:
        with django_assert_num_queries(0):
            assert LastSeen.objects.record_many({}) == 0

    def test_many_rows_in_chunks(self, make_user: Callable[..., Any]) -> None:
        users = [make_user() for _ in range(LastSeen.objects.BATCH + 3)]
        LastSeen.objects.record_many({u.pk: T for u in users})
        assert LastSeen.objects.filter(seen_at=when(T)).count() == len(users)

    def test_portable_path_follows_the_same_rule(self, make_user: Callable[..., Any]) -> None:
        # The path used by database vendors without an upsert we know how to write.
        a, b = make_user(), make_user()
        LastSeen.objects.record_many({a.pk: T})
        LastSeen.objects._record_portably([(a.pk, when(T - 60)), (b.pk, when(T))], "default")
        LastSeen.objects._record_portably([(b.pk, when(T + 5))], "default")
        seen = dict(LastSeen.objects.values_list("user_id", "seen_at"))
        assert seen == {a.pk: when(T), b.pk: when(T + 5)}

    def test_str(self, make_user: Callable[..., Any]) -> None:
        user = make_user("zoe")
        LastSeen.objects.record_many({user.pk: T})
        assert str(LastSeen.objects.get()) == f"zoe @ {when(T):%Y-%m-%d %H:%M:%S}"
