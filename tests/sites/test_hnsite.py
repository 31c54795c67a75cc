"""presence dropped into a Hacker-News-style site from the README and the book alone:
a UUID-keyed user model, no CACHES of its own, no user admin of its own, and each story's author
rendered three inclusion tags deep. Runs on tests.settings.hn only (`make test`'s hn_site run;
tests/sites/conftest.py leaves it out of the other runs)."""

from __future__ import annotations

import io
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import global_settings, settings
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from presence import api
from presence.admin import PresenceUserAdminMixin
from presence.models import Contact, PrivacySettings
from tests.sites.hnsite.models import Story
from tests.stamping import without_stamps

pytestmark = [pytest.mark.django_db, pytest.mark.hn_site]

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = (ROOT / "tests" / "settings" / "hn.py").read_text()
PASTED = "# --- below: the README's snippet, pasted"


def dot(pk: Any, status: str, label: str) -> str:
    return (
        f'<span class="presence-dot presence-dot--{status}" data-presence-user="{pk}" '
        f'title="{label}" aria-label="{label}" role="img"></span>'
    )


def row(story: Any, status: str, label: str) -> str:
    """One story as item_control > news_item > link_user render it."""
    author = story.author
    return (
        f'<tr class="athing"><td class="title">{story.title}</td><td class="subtext">by '
        f'<a href="/user?id={author.username}" class="hnuser">{author.username}</a> '
        f"{dot(author.pk, status, label)}\n</td>\n</tr>\n"
    )


@pytest.fixture
def make_hn_user(db: Any) -> Callable[..., Any]:
    def make(username: str, **fields: Any) -> Any:
        return get_user_model().objects.create_user(username, password="pw", **fields)

    return make


@pytest.fixture
def hn(make_hn_user: Callable[..., Any]) -> dict[str, Any]:
    """pg and rtm are friends; pg is online and shows it to contacts; dang is nobody to pg."""
    pg, rtm, dang = make_hn_user("pg"), make_hn_user("rtm"), make_hn_user("dang")
    Contact.objects.create(owner=pg, contact=rtm)
    Contact.objects.create(owner=rtm, contact=pg)
    PrivacySettings.objects.create(
        user=pg,
        online_visibility="contacts",
        last_seen_visibility="contacts",
        activity_visibility="contacts",
    )
    api.touch(pg)
    story = Story.objects.create(title="Show HN: presence", author=pg)
    return {"pg": pg, "rtm": rtm, "dang": dang, "story": story}


# --- the site is what the issue describes ------------------------------------------------------


def test_the_site_is_what_the_issue_describes() -> None:
    user_model = get_user_model()
    assert isinstance(user_model._meta.pk, type(user_model._meta.get_field("id")))
    assert user_model._meta.pk.get_internal_type() == "UUIDField"
    # No CACHES before the README's snippet: the snippet made them, Django's default included.
    assert not re.search(r"^CACHES\s*[=[]", SETTINGS.split(PASTED)[0], re.M)
    assert {
        "default": global_settings.CACHES["default"],
        "presence": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": settings.REDIS_URL},
    } == settings.CACHES
    # The three nested inclusion tags; link_user takes the context and hands on no request.
    from django.template import Context

    from tests.sites.hnsite.templatetags import hn as tags

    assert tags.link_user(Context({"request": object()}), "pg") == {"user": "pg"}
    assert tags.news_item("story") == {"story": "story"}
    assert tags.item_control("story") == {"story": "story"}


def test_the_settings_are_the_readmes_snippet_as_printed() -> None:
    """tests/settings/hn.py pastes the README's CACHES and PRESENCE (the Redis URL aside)."""
    readme = (ROOT / "README.md").read_text()
    printed = re.search(r"\n(# A django-redis cache alias.*?\nPRESENCE = .*?\n)", readme, re.S)
    assert printed is not None
    assert printed.group(1).replace('"redis://127.0.0.1:6379/0"', "REDIS_URL") in SETTINGS
    assert "from django.conf import global_settings" in SETTINGS


def test_the_user_admin_is_the_books_guarded_snippet() -> None:
    book = (ROOT / "docs" / "getting-started.md").read_text()
    snippet = re.search(r"```python\n# myapp/admin\.py\n(.*?)```", book, re.S)
    assert snippet is not None
    assert snippet.group(1) in (ROOT / "tests" / "sites" / "hnsite" / "admin.py").read_text()
    model_admin = admin.site.get_model_admin(get_user_model())
    assert isinstance(model_admin, PresenceUserAdminMixin)


def test_checks_pass() -> None:
    out = io.StringIO()
    call_command("check", stdout=out)  # raises SystemCheckError on any error
    assert "no issues" in out.getvalue()


# --- what its pages show ----------------------------------------------------------------------


def test_a_friend_sees_the_authors_dot_three_tags_deep(hn: dict[str, Any]) -> None:
    client = Client()
    client.force_login(hn["rtm"])
    html = without_stamps(client.get("/").content.decode(), hn["rtm"])
    assert row(hn["story"], "online", "Online") in html
    assert 'src="/static/presence/presence.js"' in html


def test_a_stranger_and_an_anonymous_visitor_see_a_strangers_dot(hn: dict[str, Any]) -> None:
    client = Client()
    client.force_login(hn["dang"])
    page = without_stamps(client.get("/").content.decode(), hn["dang"])
    assert row(hn["story"], "offline", "Offline") in page
    anonymous = Client().get("/").content.decode()
    assert row(hn["story"], "offline", "Offline") in anonymous
    # No script for a visitor whose socket would be refused.
    assert "presence.js" not in anonymous and "<script" not in anonymous


def test_the_whole_page_for_a_friend(hn: dict[str, Any]) -> None:
    client = Client()
    client.force_login(hn["rtm"])
    html = without_stamps(client.get("/").content.decode(), hn["rtm"])
    script = re.search(r"<script .*?></script>", html)
    assert script is not None
    assert html == (
        "<!doctype html>\n"
        '<title>news</title><link rel="stylesheet" href="/static/presence/presence.css">\n'
        + row(hn["story"], "online", "Online")
        + "\n"
        + script.group(0)
        + "\n"
    )


def test_the_page_views_and_the_dots_use_presences_own_cache(hn: dict[str, Any]) -> None:
    client = Client()
    client.force_login(hn["dang"])
    client.get("/")
    assert api.get_presence(hn["dang"], hn["dang"]).status == "online"  # recorded in Redis
    assert isinstance(hn["dang"].pk, uuid.UUID)


def test_the_user_admin_lists_presence(
    hn: dict[str, Any], make_hn_user: Callable[..., Any]
) -> None:
    staff = make_hn_user("admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(staff)
    response = client.get("/admin/hnsite/user/")
    assert response.status_code == 200
    # A status column with a dot for each user (what the moderator may see of each).
    html = response.content.decode()
    assert html.count('<span class="presence-dot presence-dot--') == 4
    assert get_user_model().objects.count() == 4
