"""Run in a subprocess by tests/feed/test_feed_app.py with DJANGO_SETTINGS_MODULE and DATABASE_URL
(a scratch database) set: ``python -m tests.feed_app_probe PHASE``; prints what it found as JSON.

- ``boundary``: migrate, then report the app registry, tables, feed route, a watch_feed frame
  and the parts apps add to ``presence_export``.
- ``legacy``: migrate with the legacy migrations and fill every table with rows (raw SQL for
  the feed's tables, whose models no longer exist in presence); report the rows.
- ``upgrade``: migrate with the real migrations, report the rows read through the new models,
  post once more (sequences, foreign keys) and whether makemigrations finds changes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import django

django.setup()

from django.apps import apps  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.urls import Resolver404, resolve  # noqa: E402

WHEN = "2026-01-02 03:04:05"


def boundary() -> dict[str, Any]:
    from channels.testing import WebsocketCommunicator

    from presence import extensions
    from presence.consumers import PresenceConsumer

    call_command("migrate", verbosity=0)
    try:
        resolve("/presence/api/feed/post")
        route = True
    except Resolver404:
        route = False
    user = get_user_model().objects.create_user("probe")

    async def watch_feed() -> dict[str, Any]:
        communicator = WebsocketCommunicator(PresenceConsumer.as_asgi(), "/ws/presence/")
        communicator.scope["user"] = user
        await communicator.connect(timeout=10)  # (channels' default, 1 s, is tight on a busy CI)
        await communicator.send_json_to({"type": "watch_feed", "feed": "nope"})
        frame = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect(timeout=10)
        return frame

    return {
        "models": sorted(
            model._meta.label for model in apps.get_models() if "presence" in model._meta.label
        ),
        "tables": sorted(t for t in connection.introspection.table_names() if "presence" in t),
        "feed_route": route,
        "frame": asyncio.run(watch_feed()),
        "export_parts": sorted(extensions.export_parts()),
    }


def legacy() -> dict[str, Any]:
    from presence.models import Contact

    call_command("migrate", verbosity=0)
    users = get_user_model().objects
    alice = users.create_user("alice")
    bob = users.create_user("bob")
    Contact.objects.create(owner=alice, contact=bob, close_friend=True)
    Contact.objects.create(owner=bob, contact=alice)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO presence_group (name, slug, description, created_at) "
            "VALUES (%s, %s, %s, %s)",
            ["Book club", "book-club", "Books", WHEN],
        )
        cursor.execute("SELECT id FROM presence_group")
        [(group,)] = cursor.fetchall()
        for user in (alice, bob):
            cursor.execute(
                "INSERT INTO presence_membership (group_id, user_id, joined_at) "
                "VALUES (%s, %s, %s)",
                [group, user.pk, WHEN],
            )
        for text in ("Reading Dune with @bob", "Hello"):
            cursor.execute(
                "INSERT INTO presence_activity (author_id, text, kind, created_at) "
                "VALUES (%s, %s, %s, %s)",
                [alice.pk, text, "post", WHEN],
            )
        cursor.execute(
            "SELECT id FROM presence_activity WHERE text = %s", ["Reading Dune with @bob"]
        )
        [(activity,)] = cursor.fetchall()
        cursor.execute(
            "INSERT INTO presence_mention (activity_id, user_id, created_at) VALUES (%s, %s, %s)",
            [activity, bob.pk, WHEN],
        )
    return rows()


def legacy_check() -> dict[str, Any]:
    call_command("migrate", verbosity=0)
    return rows()


def rows() -> dict[str, Any]:
    from presence.models import Contact

    found: dict[str, Any] = {
        "users": sorted(get_user_model().objects.values_list("pk", "username")),
        "contacts": sorted(Contact.objects.values_list("owner", "contact", "close_friend")),
    }
    if apps.is_installed("presence.feed"):
        from presence.feed.models import Activity, Group, Membership, Mention

        found |= {
            "groups": sorted(Group.objects.values_list("pk", "name", "slug", "description")),
            "memberships": sorted(Membership.objects.values_list("pk", "group", "user")),
            "activities": sorted(Activity.objects.values_list("pk", "author", "text", "kind")),
            "mentions": sorted(Mention.objects.values_list("pk", "activity", "user")),
        }
    else:
        with connection.cursor() as cursor:
            for key, sql in {
                "groups": "SELECT id, name, slug, description FROM presence_group",
                "memberships": "SELECT id, group_id, user_id FROM presence_membership",
                "activities": "SELECT id, author_id, text, kind FROM presence_activity",
                "mentions": "SELECT id, activity_id, user_id FROM presence_mention",
            }.items():
                cursor.execute(sql)
                found[key] = sorted(tuple(row) for row in cursor.fetchall())
    return json.loads(json.dumps(found))


def upgrade() -> dict[str, Any]:
    from presence.feed import api
    from presence.feed.models import Group

    call_command("migrate", verbosity=0)
    found = rows()
    # The taken-over tables take new rows: ids continue, mentions and memberships link up.
    alice = get_user_model().objects.get(username="alice")
    bob = get_user_model().objects.get(username="bob")
    activity = api.post(bob, "After the upgrade, @alice")
    group = Group.objects.get(slug="book-club")
    after = {
        "new_activity_id_is_new": activity.pk not in {row[0] for row in found["activities"]},
        "mentions": [m.user.username for m in api.mentions_of(activity)],
        "alice_mentions": [a.text for a in api.mentions_timeline(alice)],
        "group_timeline": [a.text for a in api.group_timeline(group, alice)],
    }
    try:
        call_command("makemigrations", "--check", "--dry-run", verbosity=0)
        clean = True
    except SystemExit:
        clean = False
    tables = sorted(t for t in connection.introspection.table_names() if "presence" in t)
    return {"rows": found, "after": after, "makemigrations_clean": clean, "tables": tables}


if __name__ == "__main__":
    phase = {
        "boundary": boundary,
        "legacy": legacy,
        "legacy-check": legacy_check,
        "upgrade": upgrade,
    }[sys.argv[1]]
    print("PROBE " + json.dumps(phase()))
