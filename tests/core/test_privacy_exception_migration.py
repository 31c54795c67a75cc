"""Migration 0004_privacyexception on a site's existing database: every row kept, every level's
default unchanged, and the new table works (rolled back to 0003, filled, migrated forward)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from presence import api, domain
from presence.models import PrivacyException, PrivacySettings

pytestmark = [pytest.mark.django_db(transaction=True)]

BEFORE = ("presence", "0003_default_privacy_and_true_presence")
NEW = ("presence", "0004_privacyexception")
SEEN = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def _migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


def _rows(apps: Any) -> dict[str, list[tuple[Any, ...]]]:
    def of(model: str, *fields: str) -> list[tuple[Any, ...]]:
        return sorted(apps.get_model("presence", model).objects.values_list(*fields))

    levels = ("online_visibility", "last_seen_visibility", "activity_visibility", "invisible")
    return {
        "privacy": of("PrivacySettings", "user_id", *levels),
        "contacts": of("Contact", "owner_id", "contact_id", "close_friend"),
        "blocks": of("Block", "blocker_id", "blocked_id"),
        "last_seen": of("LastSeen", "user_id", "seen_at"),
        "statuses": of("UserStatus", "user_id", "dnd", "text"),
    }


def test_an_existing_database_upgrades_without_losing_a_row(
    make_user: Any, django_user_model: Any
) -> None:
    leaves = [key for key in MigrationExecutor(connection).loader.graph.leaf_nodes()]
    old = _migrate([BEFORE])
    assert "privacyexception" not in {m._meta.model_name for m in old.get_models()}
    ann, ben, cy = (make_user(name) for name in ("ann", "ben", "cy"))
    old.get_model("presence", "PrivacySettings").objects.create(
        user_id=ann.pk,
        online_visibility="everyone",
        last_seen_visibility="nobody",
        activity_visibility="close_friends",
        invisible=True,
    )
    old.get_model("presence", "PrivacySettings").objects.create(user_id=ben.pk)  # the defaults
    old.get_model("presence", "Contact").objects.create(owner_id=ann.pk, contact_id=ben.pk)
    old.get_model("presence", "Contact").objects.create(
        owner_id=ben.pk, contact_id=ann.pk, close_friend=True
    )
    old.get_model("presence", "Block").objects.create(blocker_id=cy.pk, blocked_id=ann.pk)
    old.get_model("presence", "LastSeen").objects.create(user_id=cy.pk, seen_at=SEEN)
    old.get_model("presence", "UserStatus").objects.create(user_id=ann.pk, dnd=True, text="Hi")
    before = _rows(old)
    assert all(before.values()), before

    new = _migrate(leaves)
    assert _rows(new) == before  # every row kept, every level as it was
    assert before["privacy"][[r[0] for r in before["privacy"]].index(ben.pk)][1:] == (
        "contacts",
        "contacts",
        "contacts",
        False,
    )
    # The levels' defaults are still the functions of DEFAULT_PRIVACY, not values baked in.
    field = PrivacySettings._meta.get_field("online_visibility")
    assert callable(field.default)
    # The new table works at once, and an owner without exceptions reads as before.
    assert api.share_with(ann, ben, "last_seen_visibility") is True
    assert PrivacyException.objects.count() == 1
    assert api.get_presence(cy, ben).last_seen is None
    # Unapplying it drops only its own table.
    rolled_back = _migrate([BEFORE])
    assert _rows(rolled_back) == before
    _migrate(leaves)
    assert NEW in MigrationExecutor(connection).loader.applied_migrations
    assert (
        tuple(value for value, _ in PrivacyException._meta.get_field("setting").choices)
        == domain.VISIBILITY_SETTINGS
    )
