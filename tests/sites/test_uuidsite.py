"""presence on a site whose user model is keyed by a UUID (tests.sites.uuidsite). Run with
tests.settings.uuid (`make test` does, with part of the main suite): what only a UUID site shows
(the JSON endpoint, frames, Redis members, cleanup, the feed, the admin, template tags)."""

from __future__ import annotations

import binascii
import io
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
import time_machine
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.template import Context, Template
from django.test import Client, RequestFactory

from presence import api, users
from presence.announce import group_name
from presence.conf import get_settings
from presence.feed import api as feed
from presence.feed.models import Mention
from presence.models import Contact, LastSeen
from presence.store import get_store
from tests.clock import T0
from tests.live.sockets import (
    HIDDEN,
    diff,
    error,
    lets_see,
    online,
    receive,
    state,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.uuid_site,
]

PRESENCE_URL = "/presence/api/presence"


def test_the_site_is_what_the_tests_need() -> None:
    assert isinstance(get_user_model()._meta.pk.default(), uuid.UUID)
    assert users.pk_kind() == "uuid"
    out = io.StringIO()
    call_command("check", stdout=out)  # presence.E008 no longer refuses a UUID pk
    assert "no issues" in out.getvalue()


# --- the JSON endpoint ------------------------------------------------------------------------


def test_the_endpoint_takes_uuids_and_leaves_unknown_ones_out(
    make_user: Callable[..., Any], clock: Any
) -> None:
    viewer, target = make_user(), make_user()
    Contact.objects.create(owner=target, contact=viewer)
    api.touch(target)
    client = Client()
    client.force_login(viewer)
    nobody = uuid.uuid4()
    # Any case: the key is the canonical form (lowercase, hyphens).
    response = client.get(PRESENCE_URL, {"users": f"{str(target.pk).upper()},{nobody}"})
    assert response.status_code == 200
    assert response.json()["presences"] == {str(target.pk): online()}


@pytest.mark.parametrize("bad", ["7", "not-a-uuid", "0b6f2c9e-3d4a-4f1e-9c2b-7a1d5e8f9a1"])
def test_the_endpoint_refuses_what_no_uuid_is(make_user: Callable[..., Any], bad: str) -> None:
    client = Client()
    client.force_login(make_user())
    response = client.get(PRESENCE_URL, {"users": f"{uuid.uuid4()},{bad}"})
    assert response.status_code == 400
    assert response.json() == {
        "error": {"code": "invalid_users", "message": f"{bad!r} is not a user id."}
    }


# --- the store: touch, heartbeats, sweeps, cleanup --------------------------------------------


def test_a_touch_keeps_the_canonical_uuid_in_its_crc32_bucket(
    make_user: Callable[..., Any], redis_client: redis.Redis
) -> None:
    user = make_user()
    api.touch(user)
    member = str(user.pk)
    bucket = binascii.crc32(member.encode()) % get_settings().BUCKETS
    store = get_store()
    assert store.keys.bucket_of(user.pk) == bucket
    assert redis_client.zrange(store.keys.seen_key(bucket), 0, -1) == [member]
    assert redis_client.zscore(store.keys.user_due_key(user.pk), member) is not None
    assert api.get_presence(user, user).status == "online"


def test_cleanup_persists_and_removes_uuid_users(
    make_user: Callable[..., Any], redis_client: redis.Redis
) -> None:
    gone, here = make_user(), make_user()
    with time_machine.travel(T0, tick=False) as clock:
        api.touch(gone)
        clock.shift(get_settings().ONLINE_WINDOW + 1)
        api.touch(here)
        out = io.StringIO()
        call_command("presence_cleanup", stdout=out)
    assert [row.user_id for row in LastSeen.objects.all()] == [gone.pk]
    assert LastSeen.objects.get().seen_at == T0
    store = get_store()
    assert (
        redis_client.zscore(store.keys.seen_key(store.keys.bucket_of(gone.pk)), str(gone.pk))
        is None
    )
    assert redis_client.zscore(store.keys.seen_key(store.keys.bucket_of(here.pk)), str(here.pk))


# --- the WebSocket ----------------------------------------------------------------------------


async def test_a_subscribe_of_uuid_strings_is_answered_with_those_keys(
    sockets: Any,
    make_user: Callable[..., Any],
    clock: Any,
) -> None:
    viewer, target = [await sync_to_async(make_user)() for _ in range(2)]
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    spelt = str(target.pk).upper()
    nobody = str(uuid.uuid4())
    await watcher.send_json_to({"type": "subscribe", "users": [spelt, nobody]})
    assert await receive(watcher) == state({spelt: HIDDEN})
    assert await receive(watcher) == error(
        "unknown_users",
        f"No user has the id(s) {nobody}; the others are subscribed.",
        users=[nobody],
        answers="subscribe",
    )
    # A heartbeat of the UUID user: online, announced to the UUID's channel-layer group.
    assert group_name(target.pk) == f"presence.user.{target.pk}"
    await sockets.open(target)
    assert await receive(watcher) == diff({spelt: online()})
    live = await get_store().arun(get_store().plans.describe_connections(target.pk))
    assert len(live) == 1


@pytest.mark.parametrize("bad", [7, "7", "not-a-uuid"])
async def test_a_malformed_uuid_is_refused_with_a_clear_error(
    sockets: Any,
    make_user: Callable[..., Any],
    clock: Any,
    bad: Any,
) -> None:
    viewer = await sync_to_async(make_user)()
    watcher = await sockets.open(viewer)
    await watcher.send_json_to({"type": "subscribe", "users": [bad]})
    # Named the subscribe it answers: a page's malformed id is no refusal of a set_status.
    assert await receive(watcher) == error(
        "invalid_value", f"{bad!r} is not a user id.", answers="subscribe"
    )


# --- the feed, template tags, the admin ---------------------------------------------------------


def test_a_post_mentioning_a_uuid_user(make_user: Callable[..., Any]) -> None:
    author, bob = make_user("author"), make_user("bob")
    Contact.objects.create(owner=author, contact=bob)  # bob may see author's activities
    activity = feed.post(author, "hi @bob")
    assert [m.user_id for m in Mention.objects.filter(activity=activity)] == [bob.pk]
    client = Client()
    client.force_login(bob)
    timeline = client.get(f"/presence/api/feed/user/{author.pk}").json()["activities"]
    assert [(a["author"]["id"], a["mentions"]) for a in timeline] == [
        (str(author.pk), [{"id": str(bob.pk), "username": "bob"}])
    ]
    assert client.get("/presence/api/feed/user/7").status_code == 404
    assert json.loads(json.dumps(feed.activity_as_dict(activity)))["author"]["id"] == str(author.pk)


def test_template_tags_take_a_uuid_or_its_text(make_user: Callable[..., Any]) -> None:
    viewer, target = make_user(), make_user()
    Contact.objects.create(owner=target, contact=viewer)
    api.touch(target)
    request = RequestFactory().get("/")
    request.user = viewer
    html = Template(
        "{% load presence %}{% presence_dot pk %}|{% presence_dot text %}|{% presence_dot junk %}"
    ).render(Context({"request": request, "pk": target.pk, "text": str(target.pk), "junk": "7"}))
    dot = f'data-presence-user="{target.pk}"'
    first, second, third = html.split("|")
    assert dot in first and "presence-dot--online" in first
    assert dot in second and "presence-dot--online" in second
    assert third == ""


def test_the_admin_lists_uuid_users_online_now(make_user: Callable[..., Any]) -> None:
    staff = make_user("staff", is_staff=True, is_superuser=True)
    ann, ben = make_user("ann"), make_user("ben")
    Contact.objects.create(owner=ann, contact=staff)  # the moderator may see ann
    api.touch(ann)
    client = Client()
    client.force_login(staff)
    page = client.get("/admin/uuidsite/user/", {"online": "now"})
    assert page.status_code == 200
    # ann, and the moderator (online from this very request); not ben
    listed = {user.pk for user in page.context["cl"].result_list}
    assert listed == {ann.pk, staff.pk}
    assert ben.pk not in listed


def test_a_uuid_users_live_timeline_is_named_by_the_canonical_text() -> None:
    from presence.domain import InvalidInput
    from presence.feed.live import WatchFeed, parse_watch

    uid = uuid.uuid4()
    assert parse_watch({"feed": f"user:{str(uid).upper()}"}) == WatchFeed(f"user:{uid}")
    for bad in ("user:7", "user:not-a-uuid"):
        with pytest.raises(InvalidInput) as refused:
            parse_watch({"feed": bad})
        assert refused.value.code == "invalid_value"
