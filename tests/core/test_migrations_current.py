"""The migrations presence ships describe its models as the installed Django sees them: on
every Django of the support matrix (noxfile.py), makemigrations finds nothing to write for
presence or its feed (a newer Django's autodetector may see a change an older one did not), and
the test database itself is built by running them all."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.uuid_site, pytest.mark.django_db]


@pytest.mark.parametrize("app", ["presence", "presence_feed"])
def test_makemigrations_finds_nothing_to_write(app: str) -> None:
    from django.apps import apps

    if not any(config.label == app for config in apps.get_app_configs()):
        pytest.skip(f"{app} is not installed on this site")
    out = io.StringIO()
    try:
        call_command("makemigrations", app, check=True, dry_run=True, stdout=out)
    except SystemExit:  # --check exits non-zero when a migration is missing
        pytest.fail(f"makemigrations would write a migration for {app}:\n{out.getvalue()}")


def test_every_migration_of_presence_is_applied_to_the_test_database() -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    targets = executor.loader.graph.leaf_nodes()
    assert executor.migration_plan(targets) == []
    applied = {name for app, name in executor.loader.applied_migrations if app == "presence"}
    assert "0001_initial" in applied
