"""The users ``online_friends`` lists are loaded as the user model's manager loads them, down to
Django 6.1's fetch modes: a site whose manager reads related objects for all the users read
together (``FETCH_PEERS``), or refuses lazy reads (``FETCH_RAISE``), gets that on these users
too (presence builds them from its own query, not through the manager)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import django
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from presence import relations
from presence.models import UserStatus

pytestmark = [
    pytest.mark.uuid_site,
    pytest.mark.skipif(django.VERSION < (6, 1), reason="fetch modes are new in Django 6.1"),
]


@pytest.fixture
def manager_fetch_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Any], None]]:
    """Makes the user model's default manager load in the given fetch mode, as a site would by
    overriding its manager's ``get_queryset``."""
    manager_class = type(get_user_model()._default_manager)
    original = manager_class.get_queryset

    def use(mode: Any) -> None:
        monkeypatch.setattr(
            manager_class, "get_queryset", lambda self: original(self).fetch_mode(mode)
        )

    yield use


def test_the_managers_peers_mode_reads_a_relation_for_every_listed_user_at_once(
    make_user: Callable[..., Any], manager_fetch_mode: Callable[[Any], None]
) -> None:
    from django.db.models import FETCH_PEERS

    manager_fetch_mode(FETCH_PEERS)
    viewer, *friends = (make_user() for _ in range(4))
    for friend in friends:
        UserStatus.objects.create(user=friend, dnd=True, text=f"busy {friend.pk}")
    ids = [friend.pk for friend in friends]
    built = relations.load_with_users(viewer, ids).users(ids)
    loaded = get_user_model()._default_manager.in_bulk(ids)
    for user in built:
        assert vars(user._state).keys() == vars(loaded[user.pk]._state).keys()
        assert user._state.fetch_mode is FETCH_PEERS
    # The first read fetches every listed user's status; the others cost nothing.
    with CaptureQueriesContext(connection) as queries:
        texts = [user.presence_status.text for user in built]
    assert texts == [f"busy {pk}" for pk in ids]
    assert len(queries) == 1


def test_the_managers_raise_mode_refuses_lazy_reads_on_listed_users(
    make_user: Callable[..., Any], manager_fetch_mode: Callable[[Any], None]
) -> None:
    from django.core.exceptions import FieldFetchBlocked
    from django.db.models import FETCH_RAISE

    manager_fetch_mode(FETCH_RAISE)
    viewer, friend = make_user(), make_user()
    UserStatus.objects.create(user=friend, dnd=True)
    (built,) = relations.load_with_users(viewer, [friend.pk]).users([friend.pk])
    with pytest.raises(FieldFetchBlocked):
        built.presence_status  # noqa: B018
    # As on a user the manager loads.
    with pytest.raises(FieldFetchBlocked):
        get_user_model()._default_manager.get(pk=friend.pk).presence_status  # noqa: B018
