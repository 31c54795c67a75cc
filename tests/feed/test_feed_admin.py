"""The admin of the activity feed: groups with their members, activities with their mentions."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client

from presence.feed import api as feed
from presence.feed.models import Activity, Group, Membership, Mention
from presence.models import PrivacySettings
from tests.clock import T0
from tests.core.test_admin import form_values

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(make_user: Callable[..., Any]) -> Client:
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def content(make_user: Callable[..., Any]) -> dict[str, Any]:
    alice, bob = make_user("alice"), make_user("bob")
    group = Group.objects.create(name="Book club", slug="book-club", description="Monthly")
    Membership.objects.create(group=group, user=alice)
    Membership.objects.create(group=group, user=bob)
    first = feed.post(alice, "Reading Dune with @bob")
    second = feed.post(bob, "Chapter two tonight")
    return {"alice": alice, "bob": bob, "group": group, "first": first, "second": second}


@pytest.mark.parametrize("model", ["group", "activity"])
def test_changelists_render(model: str, admin_client: Client, content: dict[str, Any]) -> None:
    page = admin_client.get(f"/admin/presence_feed/{model}/")
    assert page.status_code == 200


def test_group_list_shows_member_counts(admin_client: Client, content: dict[str, Any]) -> None:
    page = admin_client.get("/admin/presence_feed/group/").content.decode()
    assert "Book club" in page
    assert '<td class="field-member_count">2</td>' in page


def test_activity_search_covers_text_and_author(
    admin_client: Client, content: dict[str, Any]
) -> None:
    by_text = admin_client.get("/admin/presence_feed/activity/", {"q": "dune"}).content.decode()
    assert "Reading Dune with @bob" in by_text and "Chapter two" not in by_text
    by_author = admin_client.get("/admin/presence_feed/activity/", {"q": "bob"}).content.decode()
    assert "Chapter two tonight" in by_author
    # The newest first.
    everything = admin_client.get("/admin/presence_feed/activity/").content.decode()
    assert everything.index("Chapter two tonight") < everything.index("Reading Dune")


def test_group_change_page_edits_members_inline(
    admin_client: Client, content: dict[str, Any], make_user: Callable[..., Any]
) -> None:
    carol = make_user("carol")
    group = content["group"]
    url = f"/admin/presence_feed/group/{group.pk}/change/"
    values = form_values(admin_client.get(url).content.decode())
    values["description"] = group.description  # a textarea, which form_values does not read
    assert values["memberships-TOTAL_FORMS"] == "2"
    values["memberships-TOTAL_FORMS"] = "3"
    values["memberships-2-user"] = str(carol.pk)
    values["memberships-2-group"] = str(group.pk)
    values["memberships-0-DELETE"] = "on"
    response = admin_client.post(url, values)
    assert response.status_code == 302
    members = set(Membership.objects.filter(group=group).values_list("user__username", flat=True))
    assert len(members) == 2 and "carol" in members
    # The timeline follows the members as they are now.
    assert {a.author.username for a in feed.group_timeline(group, None).activities} <= members


def test_add_group_with_a_member(admin_client: Client, content: dict[str, Any]) -> None:
    assert admin_client.get("/admin/presence_feed/group/add/").status_code == 200
    response = admin_client.post(
        "/admin/presence_feed/group/add/",
        {
            "name": "Climbers",
            "slug": "climbers",
            "description": "",
            "memberships-TOTAL_FORMS": "1",
            "memberships-INITIAL_FORMS": "0",
            "memberships-0-user": str(content["alice"].pk),
        },
    )
    assert response.status_code == 302
    assert list(Group.objects.get(slug="climbers").members.all()) == [content["alice"]]
    duplicate = admin_client.post(
        "/admin/presence_feed/group/add/",
        {
            "name": "Again",
            "slug": "climbers",
            "memberships-TOTAL_FORMS": "0",
            "memberships-INITIAL_FORMS": "0",
        },
    )
    assert duplicate.status_code == 200  # the unique slug is refused by the form


def test_activity_change_keeps_mention_times_in_step(
    admin_client: Client, content: dict[str, Any], make_user: Callable[..., Any]
) -> None:
    activity = content["first"]
    carol = make_user("carol")
    url = f"/admin/presence_feed/activity/{activity.pk}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200
    values = form_values(page.content.decode())
    values["text"] = activity.text  # a textarea, which form_values does not read
    assert values["mentions-TOTAL_FORMS"] == "1"
    earlier = T0 - timedelta(days=1)
    values["created_at_0"] = earlier.strftime("%Y-%m-%d")
    values["created_at_1"] = earlier.strftime("%H:%M:%S")
    values["mentions-TOTAL_FORMS"] = "2"
    values["mentions-1-user"] = str(carol.pk)
    values["mentions-1-activity"] = str(activity.pk)
    response = admin_client.post(url, values)
    assert response.status_code == 302
    activity.refresh_from_db()
    assert activity.created_at == earlier
    mentions = Mention.objects.filter(activity=activity)
    assert {m.user.username for m in mentions} == {"bob", "carol"}
    assert {m.created_at for m in mentions} == {earlier}
    # The mentions timeline pages by that time: carol's mention is found, in its place.
    PrivacySettings.objects.create(user=content["alice"], activity_visibility="everyone")
    assert [a.pk for a in feed.mentions_timeline(carol).activities] == [activity.pk]


def test_activity_add_page_renders(admin_client: Client) -> None:
    assert admin_client.get("/admin/presence_feed/activity/add/").status_code == 200
    assert Activity.objects.count() == 0


def test_editing_the_text_keeps_mentions_linked_where_the_new_text_names_them(
    admin_client: Client, content: dict[str, Any], make_user: Callable[..., Any]
) -> None:
    activity = content["first"]
    carol = make_user("carol")
    url = f"/admin/presence_feed/activity/{activity.pk}/change/"
    values = form_values(admin_client.get(url).content.decode())
    # The places recorded when posted were in the old text; carol is added here.
    values["text"] = "Dune tonight: @carol and @bob"
    values["mentions-TOTAL_FORMS"] = "2"
    values["mentions-1-user"] = str(carol.pk)
    values["mentions-1-activity"] = str(activity.pk)
    assert admin_client.post(url, values).status_code == 302
    assert feed.render_text(Activity.objects.get(pk=activity.pk)) == (
        'Dune tonight: <span class="mention">@carol</span> and <span class="mention">@bob</span>'
    )
