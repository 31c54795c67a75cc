"""A user's data in the activity feed: feed.export_user_data / aexport_user_data and its part
(``"feed"``) in ``manage.py presence_export``: what they posted (with whom they mention), their
groups, and the mentions of them they may see; mentions in posts hidden from them left out."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import async_to_sync
from django.core.management import call_command

from presence import api
from presence.feed import api as feed
from presence.feed.models import ActivityKind, Group
from presence.models import Block, PrivacySettings
from tests.clock import at
from tests.ids import wire_id

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site]


def someone(user: Any) -> dict[str, Any]:
    return {"id": wire_id(user), "username": user.get_username()}


@pytest.fixture
def world(make_user: Callable[..., Any], clock: time_machine.Coordinates) -> Any:
    """Alice posts, mentions Bob and herself, is in two groups; Bob, Carol and Dave mention her."""
    alice, bob, carol, dave = (make_user(name) for name in ("alice", "bob", "carol", "dave"))
    PrivacySettings.objects.create(user=bob, activity_visibility="everyone")
    PrivacySettings.objects.create(user=carol, activity_visibility="nobody")
    PrivacySettings.objects.create(user=dave, activity_visibility="everyone")
    algebra = Group.objects.create(name="Algebra", slug="algebra")
    chess = Group.objects.create(name="Chess club", slug="chess")
    feed.join(alice, algebra)
    clock.shift(60)
    feed.join(alice, chess)
    feed.join(bob, chess)  # (Bob's membership is not Alice's data)
    lunch = feed.post(alice, "Lunch with @bob? @alice pays")
    clock.shift(60)
    status = feed.post(alice, "Studying", kind=ActivityKind.STATUS)
    seen = feed.post(bob, "@alice the answers are in")
    hidden = feed.post(carol, "@alice never to know")  # Carol shows her posts to nobody
    blocked = feed.post(dave, "@alice before the block")
    Block.objects.create(blocker=dave, blocked=alice)  # hidden from her since
    feed.post(bob, "not about anyone")
    return {
        "people": (alice, bob, carol, dave),
        "posts": (lunch, status, seen, hidden, blocked),
    }


def expected(world: Any) -> dict[str, Any]:
    alice, bob, _, _ = world["people"]
    lunch, status, seen, _, _ = world["posts"]
    return {
        "activities": [
            {
                "id": lunch.pk,
                "kind": "post",
                "text": "Lunch with @bob? @alice pays",
                "created_at": at(60).isoformat(),
                "mentions": [someone(bob), someone(alice)],
            },
            {
                "id": status.pk,
                "kind": "status",
                "text": "Studying",
                "created_at": at(120).isoformat(),
                "mentions": [],
            },
        ],
        "memberships": [
            {"group": "algebra", "name": "Algebra", "joined_at": at(0).isoformat()},
            {"group": "chess", "name": "Chess club", "joined_at": at(60).isoformat()},
        ],
        # Bob's, which she may see; not Carol's (nobody) nor Dave's (he blocked her since),
        # not even counted; her own mention of herself is in her activities.
        "mentions": [
            {
                "activity": seen.pk,
                "author": someone(bob),
                "kind": "post",
                "text": "@alice the answers are in",
                "created_at": at(120).isoformat(),
            }
        ],
    }


def test_the_export_holds_her_posts_groups_and_the_mentions_she_may_see(world: Any) -> None:
    alice = world["people"][0]
    exported = feed.export_user_data(alice)
    assert exported == expected(world)
    assert feed.export_user_data(alice.pk) == exported  # a user id will do
    assert json.loads(json.dumps(exported)) == exported  # JSON-ready as it is


def test_the_async_twin(world: Any, close_async_db_connections: Any) -> None:
    assert async_to_sync(feed.aexport_user_data)(world["people"][0]) == expected(world)


def test_a_user_the_feed_never_saw(make_user: Callable[..., Any]) -> None:
    user = make_user()
    assert feed.export_user_data(user) == {"activities": [], "memberships": [], "mentions": []}


def test_presence_export_adds_the_feed_part(world: Any) -> None:
    alice = world["people"][0]
    out = io.StringIO()
    call_command("presence_export", alice.get_username(), stdout=out)
    printed = json.loads(out.getvalue())
    assert printed["feed"] == expected(world)
    assert {key: value for key, value in printed.items() if key != "feed"} == json.loads(
        json.dumps(api.export_user_data(alice))
    )
