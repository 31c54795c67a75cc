"""A site as it was before the feed became an app: presence alone, with presence's migrations as
they were then (0002_feed created the feed's tables inside presence).
tests/feed/test_feed_app.py."""

from __future__ import annotations

from tests.settings.core_only import *  # noqa: F403

MIGRATION_MODULES = {"presence": "tests.legacy_migrations"}
