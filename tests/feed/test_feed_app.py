"""presence.feed as an app of its own: what a site gets without it and with it, and the upgrade
of a database made while the feed lived inside presence (tests/legacy_migrations/).

Each scenario runs tests/feed_app_probe.py in a subprocess with its own settings and a scratch
database of its own (SQLite; on PostgreSQL too when DATABASE_URL names one), dropped afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dj_database_url
import pytest

ROOT = Path(__file__).resolve().parents[2]
FEED_MODELS = [
    "presence_feed.Activity",
    "presence_feed.Group",
    "presence_feed.Membership",
    "presence_feed.Mention",
]
CORE_MODELS = [
    "presence.Block",
    "presence.Contact",
    "presence.LastSeen",
    "presence.PrivacyException",
    "presence.PrivacySettings",
    "presence.UserStatus",
]
LEGACY_TABLES = ["presence_activity", "presence_group", "presence_membership", "presence_mention"]
FEED_TABLES = [
    "presence_feed_activity",
    "presence_feed_group",
    "presence_feed_membership",
    "presence_feed_mention",
]


def probe(phase: str, settings_module: str, database_url: str) -> dict[str, Any]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings_module, "DATABASE_URL": database_url}
    # subprocess.run kills the child when the timeout passes.
    done = subprocess.run(
        [sys.executable, "-m", "tests.feed_app_probe", phase],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    return json.loads(line.removeprefix("PROBE "))


def _postgres_scratch() -> Iterator[str]:
    import psycopg

    main = dj_database_url.parse(os.environ["DATABASE_URL"])
    name = f"presence_feed_app_{uuid.uuid4().hex[:8]}"
    params = {
        "host": main["HOST"] or "127.0.0.1",
        "port": main["PORT"] or 5432,
        "user": main["USER"],
        "password": main["PASSWORD"],
        "dbname": "postgres",
        "autocommit": True,
    }
    with psycopg.connect(**params) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        auth = main["USER"] + (f":{main['PASSWORD']}" if main["PASSWORD"] else "")
        yield f"postgres://{auth}@{params['host']}:{params['port']}/{name}"
    finally:
        with psycopg.connect(**params) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


BACKENDS = ["sqlite"]
if os.environ.get("DATABASE_URL", "").startswith("postgres"):
    BACKENDS.append("postgresql")


@pytest.fixture(params=BACKENDS)
def scratch_database(request: Any, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'scratch.sqlite3'}"
    else:
        yield from _postgres_scratch()


def test_a_site_with_presence_alone_gets_nothing_of_the_feed(scratch_database: str) -> None:
    found = probe("boundary", "tests.settings.core_only", scratch_database)
    assert [m for m in found["models"] if m.startswith("presence")] == CORE_MODELS
    assert not [t for t in found["tables"] if "feed" in t or t in LEGACY_TABLES]
    assert found["feed_route"] is False
    assert found["export_parts"] == []  # presence_export prints presence's own keys only
    frame = found["frame"]
    assert frame["type"] == "error"
    assert frame["code"] == "unknown_type"
    assert frame["message"].endswith(
        "heartbeat, subscribe, unsubscribe, set_status, join, leave, room_more, watch_count, "
        "unwatch_count, watch_room_count, unwatch_room_count."
    )


def test_a_site_with_the_feed_gets_all_of_it(scratch_database: str) -> None:
    found = probe("boundary", "tests.settings.base", scratch_database)
    assert [m for m in found["models"] if m.startswith("presence")] == CORE_MODELS + FEED_MODELS
    assert set(FEED_TABLES) <= set(found["tables"])
    assert not set(LEGACY_TABLES) & set(found["tables"])
    assert found["feed_route"] is True
    assert found["export_parts"] == ["feed"]  # presence_export adds the feed's part
    # watch_feed is a frame type now: a bad feed name is refused as such.
    assert found["frame"]["code"] == "invalid_value"


def test_a_database_from_before_the_feed_app_upgrades_without_losing_a_row(
    scratch_database: str,
) -> None:
    before = probe("legacy", "tests.settings.legacy", scratch_database)
    assert all(before[key] for key in before), before  # a row in every table

    # Migrating presence alone (the feed not installed) leaves the old tables untouched.
    untouched = probe("legacy-check", "tests.settings.core_only", scratch_database)
    assert untouched == before

    upgraded = probe("upgrade", "tests.settings.base", scratch_database)
    assert upgraded["rows"] == before
    assert set(FEED_TABLES) <= set(upgraded["tables"])
    assert not set(LEGACY_TABLES) & set(upgraded["tables"])
    assert upgraded["after"] == {
        "new_activity_id_is_new": True,
        "mentions": ["alice"],
        "alice_mentions": ["After the upgrade, @alice"],
        "group_timeline": ["After the upgrade, @alice", "Hello", "Reading Dune with @bob"],
    }
    assert upgraded["makemigrations_clean"] is True
