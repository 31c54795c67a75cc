"""presence on a site whose user model logs in by e-mail and has no username
(tests.sites.emailsite), with no User admin registered. Run with tests.settings.email (`make test`
does, after the main suite): the admin, the checks, mention suggestions, the feed's JSON and the
contacts API."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from presence import api
from presence.feed.models import Activity, Group
from presence.models import Block, Contact, LastSeen, PrivacySettings, UserStatus
from presence.rooms.cards import cards_for_keys

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.email_site,
]


@pytest.fixture
def make_email_user(db: Any) -> Callable[..., Any]:
    def make(email: str, **fields: Any) -> Any:
        return get_user_model().objects.create_user(email, "pw", **fields)

    return make


def test_the_site_is_what_the_test_needs() -> None:
    user_model = get_user_model()
    assert user_model.USERNAME_FIELD == "email"
    assert "username" not in {field.name for field in user_model._meta.get_fields()}
    assert not admin.site.is_registered(user_model)


def test_checks_pass_without_a_user_admin() -> None:
    out = io.StringIO()
    call_command("check", stdout=out)  # raises SystemCheckError on any error (admin.E039)
    assert "no issues" in out.getvalue()


@pytest.mark.parametrize(
    "model", [PrivacySettings, UserStatus, Contact, Block, LastSeen, Group, Activity]
)
def test_every_admin_search_answers(model: Any, make_email_user: Callable[..., Any]) -> None:
    staff = make_email_user("admin@example.com", is_staff=True, is_superuser=True)
    ann = make_email_user("ann@example.com")
    Contact.objects.create(owner=staff, contact=ann)
    PrivacySettings.objects.create(user=ann)
    client = Client()
    client.force_login(staff)
    meta = model._meta
    response = client.get(f"/admin/{meta.app_label}/{meta.model_name}/", {"q": "ann"})
    assert response.status_code == 200
    # The add form takes user ids as text (raw id inputs): no autocomplete without a user
    # admin, and no <select> listing every user of the site.
    if model is not LastSeen:
        form = client.get(f"/admin/{meta.app_label}/{meta.model_name}/add/")
        assert form.status_code == 200
        assert b"admin-autocomplete" not in form.content
        assert b"ann@example.com</option>" not in form.content


def test_no_email_address_leaks_through_the_feed(
    make_email_user: Callable[..., Any], settings: Any
) -> None:
    author = make_email_user("author@example.com")
    ann = make_email_user("ann@example.com")
    Contact.objects.create(owner=author, contact=ann)
    client = Client()
    client.force_login(ann)
    suggestions = client.get("/presence/api/feed/mention-suggestions", {"q": "a"})
    assert suggestions.status_code == 200 and suggestions.json() == {"users": []}
    poster = Client()
    poster.force_login(author)
    posted = poster.post(
        "/presence/api/feed/post",
        json.dumps({"text": "Hi @ann"}),
        content_type="application/json",
    )
    assert posted.status_code == 201
    timeline = client.get(f"/presence/api/feed/user/{author.pk}")
    assert timeline.status_code == 200
    body = posted.content.decode() + timeline.content.decode()
    assert "@example.com" not in body
    assert timeline.json()["activities"][0]["author"] == {"id": author.pk, "username": None}


def test_a_public_handle_field_gives_mentions_and_suggestions(
    make_email_user: Callable[..., Any], settings: Any
) -> None:
    settings.PRESENCE_FEED = {"HANDLE_FIELD": "handle"}
    author = make_email_user("author@example.com", handle="author")
    ann = make_email_user("ann@example.com", handle="ann")
    Contact.objects.create(owner=author, contact=ann)
    client = Client()
    client.force_login(author)
    suggestions = client.get("/presence/api/feed/mention-suggestions", {"q": "an"})
    assert suggestions.json() == {"users": [{"id": ann.pk, "username": "ann"}]}
    posted = client.post(
        "/presence/api/feed/post", json.dumps({"text": "Hi @ann"}), content_type="application/json"
    )
    assert posted.json()["activity"]["mentions"] == [{"id": ann.pk, "username": "ann"}]
    assert "@example.com" not in posted.content.decode()


def test_the_contacts_api_and_presence_work_with_this_user_model(
    make_email_user: Callable[..., Any],
) -> None:
    ann, ben = make_email_user("ann@example.com"), make_email_user("ben@example.com")
    assert api.follow(ann, ben) is True
    api.touch(ann)
    assert api.get_presence(ann, ben).status == "online"
    assert api.block(ben, ann) is True
    assert api.get_presence(ann, ben).status == "offline"


def test_member_cards_name_members_by_their_email(make_email_user: Callable[..., Any]) -> None:
    ann = make_email_user("ann@example.com")
    bo = make_email_user("bo@example.com", handle="bo")
    assert cards_for_keys([str(ann.pk), str(bo.pk)]) == {
        str(ann.pk): {"name": "ann@example.com", "avatar": None},
        str(bo.pk): {"name": "bo@example.com", "avatar": None},
    }
    assert api.member_card(ann) == {"name": "ann@example.com", "avatar": None}
