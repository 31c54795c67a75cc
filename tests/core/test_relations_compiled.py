"""presence.relations.compiled: the facts query's SQL is compiled once per shape and gives what
the queryset gives, for every kind of relation and choice, with reciprocity or not; and the
existence check of a subscribe asks the database only about ids not found before."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test.utils import CaptureQueriesContext

from presence import relations
from presence.models import Block, Contact, LastSeen, PrivacyException, PrivacySettings, UserStatus
from presence.relations import compiled, facts, rows
from tests.ids import missing_id

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site]


def _graph(make_user: Callable[..., Any]) -> tuple[Any, list[Any]]:
    viewer = make_user()
    targets = [make_user() for _ in range(7)]
    contact, close, blocker, blocked, private, excepted, _stranger = targets
    Contact.objects.create(owner=contact, contact=viewer)
    Contact.objects.create(owner=close, contact=viewer, close_friend=True)
    Contact.objects.create(owner=viewer, contact=close)
    Block.objects.create(blocker=blocker, blocked=viewer)
    Block.objects.create(blocker=viewer, blocked=blocked)
    PrivacySettings.objects.create(user=private, online_visibility="nobody", invisible=True)
    PrivacySettings.objects.create(user=viewer, last_seen_visibility="nobody")
    PrivacyException.objects.create(
        owner=excepted, viewer=viewer, setting="online_visibility", allow=True
    )
    UserStatus.objects.create(
        user=close, dnd=True, text="away", expires_at=datetime(2030, 1, 1, tzinfo=UTC)
    )
    LastSeen.objects.create(user=contact, seen_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    return viewer, targets


def _by_queryset(viewer: Any, ids: list[Any]) -> relations.Facts:
    viewer_pk = None if viewer is None else viewer.pk
    rows = list(relations.facts_query(viewer_pk, ids))
    return facts._facts(viewer_pk, rows, facts.reciprocal())


@pytest.mark.parametrize("reciprocal", [False, True])
@pytest.mark.parametrize("anonymous", [False, True])
def test_compiled_sql_reads_what_the_queryset_reads(
    reciprocal: bool, anonymous: bool, make_user: Callable[..., Any], settings: Any
) -> None:
    viewer, targets = _graph(make_user)
    ids = [viewer.pk, *(t.pk for t in targets), missing_id()]
    who = None if anonymous else viewer
    settings.PRESENCE = {**getattr(settings, "PRESENCE", {}), "RECIPROCAL_LAST_SEEN": reciprocal}
    expected = _by_queryset(who, ids)
    compiled._compiled.clear()
    with CaptureQueriesContext(connection) as queries:
        first = relations.load(who, ids)
        again = relations.load(who, list(reversed(ids)))
    assert first == again == expected
    assert len(expected) == len(ids) - 1  # the missing id is left out
    assert len(queries) == 2  # one query a call
    # One shape, compiled (not left to the queryset): both calls used it.
    (shape,) = compiled._compiled.values()
    assert shape is not None and shape.size == 16


def test_compiled_rows_hold_what_the_queryset_gives_value_for_value(
    make_user: Callable[..., Any],
) -> None:
    """Each value converted as the queryset converts it (a boolean as a bool, not 0 or 1; a
    time as a datetime), in columns where some rows hold None and others not."""
    viewer, targets = _graph(make_user)
    ids = [viewer.pk, *(t.pk for t in targets)]

    def typed(found: Any) -> dict[Any, list[tuple[type, Any]]]:
        return {row[0]: [(type(value), value) for value in row] for row in found}

    compiled._compiled.clear()
    got = typed(facts.fact_rows(viewer.pk, ids))
    assert compiled._compiled and None not in compiled._compiled.values()  # compiled SQL ran
    assert got == typed(relations.facts_query(viewer.pk, ids))


@pytest.mark.parametrize("count", [1, 3, 50, 64, 65])
def test_padding_to_a_size_changes_nothing(count: int, make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    users = [make_user() for _ in range(count)]
    ids = [u.pk for u in users]
    assert relations.load(viewer, ids) == _by_queryset(viewer, ids)
    assert compiled.padded_size(count) in {1, 4, 64, 128}


def test_past_the_largest_size_the_queryset_runs(make_user: Callable[..., Any]) -> None:
    viewer = make_user()
    user = make_user()
    ids = [user.pk, *(missing_id(n) for n in range(compiled.LARGEST))]
    assert compiled.padded_size(len(ids)) is None
    assert relations.load(viewer, ids) == _by_queryset(viewer, [user.pk])


def test_ids_found_to_be_users_are_not_asked_again(make_user: Callable[..., Any]) -> None:
    first, second = make_user(), make_user()
    nobody = missing_id()
    rows._known.clear()
    existing = async_to_sync(relations.aexisting)
    with CaptureQueriesContext(connection) as queries:
        assert existing([first.pk, second.pk, nobody]) == {first.pk, second.pk}
        assert existing([first.pk, second.pk]) == {first.pk, second.pk}  # no query
        assert existing([first.pk, nobody]) == {first.pk}  # an id of no user is asked again
    assert len(queries) == 2
    # A user deleted since is forgotten once a snapshot missed them (the consumer's part).
    second_pk = second.pk
    second.delete()
    relations.forget_existing([second_pk])
    with CaptureQueriesContext(connection) as queries:
        assert existing([first.pk, second_pk]) == {first.pk}
    assert len(queries) == 1
