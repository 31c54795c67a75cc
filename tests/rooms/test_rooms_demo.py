"""The demo's rooms (siteproject/settings.py's ROOMS, siteproject/demo/rooms.py): a post's page
shows who is reading it to whoever may read it; a group's page shows who is in the group now to
its members only. (Live, in a browser: tests/browser/test_browser_rooms.py.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from presence.feed import api as feed
from presence.feed.models import Group
from presence.models import Contact
from tests.rooms.members import enter

pytestmark = pytest.mark.django_db

ROOMS = {
    "post": "siteproject.demo.rooms.can_read_post",
    "group": "siteproject.demo.rooms.is_group_member",
}


@pytest.fixture(autouse=True)
def _demo_rooms(settings: Any) -> None:
    settings.PRESENCE = {"ROOMS": ROOMS}


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_posts_readers_see_who_else_is_reading_it(make_user: Callable[..., Any]) -> None:
    ann, ben, cy = make_user("ann"), make_user("ben"), make_user("cy")
    Contact.objects.create(owner=ann, contact=ben)  # ann's posts and presence: for ben
    post = feed.post(ann, "hello")
    enter(ann, f"post:{post.pk}")
    page = logged_in(ben).get(f"/posts/{post.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f'data-presence-room="post:{post.pk}"' in html
    assert f'data-presence-room-member="{ann.pk}"' in html
    assert logged_in(cy).get(f"/posts/{post.pk}/").status_code == 404  # may not read it
    assert logged_in(ben).get(f"/presence/api/rooms/post:{post.pk}").status_code == 200
    assert logged_in(cy).get(f"/presence/api/rooms/post:{post.pk}").status_code == 403
    assert logged_in(cy).get("/presence/api/rooms/post:nope").status_code == 403


def test_a_groups_members_see_who_is_in_it_now(make_user: Callable[..., Any]) -> None:
    ann, ben, cy = make_user("ann"), make_user("ben"), make_user("cy")
    group = Group.objects.create(name="Climbers", slug="climbers")
    feed.join(ann, group)
    feed.join(ben, group)
    Contact.objects.create(owner=ann, contact=ben)
    enter(ann, "group:climbers")
    html = logged_in(ben).get("/groups/climbers/").content.decode()
    assert 'data-presence-room="group:climbers"' in html
    assert f'data-presence-room-member="{ann.pk}"' in html
    other = logged_in(cy).get("/groups/climbers/")  # no member: the page, without the room
    assert other.status_code == 200
    assert "data-presence-room" not in other.content.decode()
