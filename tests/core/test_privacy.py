"""presence.privacy: visible_to(), the privacy rule as a queryset filter, keeps exactly the owners
that domain.permits admits, for every visibility setting, level and tie."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from presence import privacy
from presence.domain import Relation, Visibility
from presence.models import Block, Contact, PrivacySettings

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.uuid_site,
]

TIES = {
    "stranger": Relation(),
    "contact": Relation(is_contact=True),
    "close_friend": Relation(is_contact=True, is_close_friend=True),
    "blocked": Relation(is_contact=True, is_close_friend=True, blocked=True),
}


@pytest.mark.parametrize("setting", privacy.SETTINGS)
def test_visible_to_keeps_what_permits_admits(setting: str, make_user: Callable[..., Any]) -> None:
    viewer = make_user(username="viewer")
    expected: set[int] = {viewer.pk}  # one always sees oneself
    for level in [*Visibility, None]:  # None: no PrivacySettings row (the default)
        for tie, relation in TIES.items():
            owner = make_user(username=f"{level}-{tie}")
            if level is not None:
                PrivacySettings.objects.create(user=owner, **{setting: level})
            if relation.is_contact:
                Contact.objects.create(
                    owner=owner, contact=viewer, close_friend=relation.is_close_friend
                )
            if relation.blocked:
                Block.objects.create(blocker=owner, blocked=viewer)
            if privacy.permits(level or Visibility.CONTACTS, relation):
                expected.add(owner.pk)
    users = get_user_model().objects
    kept = set(users.filter(privacy.visible_to(viewer, "pk", setting)).values_list("pk", flat=True))
    assert kept == expected
    # The same rule through a relation (owner_field) and for an anonymous viewer.
    through = Contact.objects.filter(privacy.visible_to(viewer.pk, "owner", setting))
    owners = set(Contact.objects.values_list("owner", flat=True))
    assert set(through.values_list("owner", flat=True)) == expected & owners
    anonymous = set(
        users.filter(privacy.visible_to(None, "pk", setting)).values_list("pk", flat=True)
    )
    everyone = set(
        PrivacySettings.objects.filter(**{setting: Visibility.EVERYONE}).values_list(
            "user", flat=True
        )
    )
    assert anonymous == everyone


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(ValueError):
        privacy.visible_to(None, "pk", "invisible")
