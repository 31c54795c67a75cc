"""The admin for moderators: presence's stylesheet on the admin's pages (the dots have a size), and
the permission presence.view_true_presence, which shows true presence in the admin (columns, the
"online now" filter, sorting by last seen) and nowhere else."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser, Permission
from django.template import Context, Template
from django.templatetags.static import static
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from presence import api
from presence.models import Contact, LastSeen, PrivacySettings
from tests.privacy_cases import quiet_login

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.uuid_site,
]


def _user_admin_url(name: str, *args: Any) -> str:
    options = get_user_model()._meta
    return reverse(f"admin:{options.app_label}_{options.model_name}_{name}", args=args)


def _staff(make_user: Callable[..., Any], name: str, *codenames: str) -> Any:
    user = make_user(name, is_staff=True)
    options = get_user_model()._meta
    user.user_permissions.add(
        Permission.objects.get(
            codename=f"view_{options.model_name}", content_type__app_label=options.app_label
        ),
        *(
            Permission.objects.get(codename=codename, content_type__app_label="presence")
            for codename in codenames
        ),
    )
    return get_user_model().objects.get(pk=user.pk)  # no cached permissions


def _client(user: Any) -> Client:
    client = Client()
    quiet_login(client, user)  # no activity of the moderator's own
    return client


def _row(html: str, user: Any) -> str:
    """The changelist row of ``user`` ("" when not listed)."""
    link = _user_admin_url("change", user.pk)
    match = re.search(rf'href="{re.escape(link)}[?"]', html)
    if match is None:
        return ""
    return html[match.start() : html.index("</tr>", match.start())]


@pytest.fixture
def hidden(clock: Any, make_user: Callable[..., Any]) -> dict[str, Any]:
    """Online users privacy hides from a moderator: one without privacy settings (contacts
    only, the default, and the moderator is none), one invisible (seen by everyone else), and
    one who lets everyone see them."""
    secret, ghost, public = make_user("secret"), make_user("ghost"), make_user("public")
    PrivacySettings.objects.create(user=ghost, online_visibility="everyone", invisible=True)
    PrivacySettings.objects.create(user=public, **dict.fromkeys(_FIELDS, "everyone"))
    for user in (secret, ghost, public):
        api.touch(user)
    return {"secret": secret, "ghost": ghost, "public": public}


_FIELDS = ("online_visibility", "last_seen_visibility", "activity_visibility")


# --- 5: the stylesheet ---------------------------------------------------------------------------


def test_the_user_changelist_links_presences_stylesheet(
    clock: Any, make_user: Callable[..., Any]
) -> None:
    staff = _staff(make_user, "staff")
    html = _client(staff).get(_user_admin_url("changelist")).content.decode()
    assert "presence-dot" in html
    link = f'<link href="{static("presence/presence.css")}" media="all" rel="stylesheet">'
    assert link in html
    # Once, and on a user's page (the inlines' form) and presence's own admin pages too.
    assert html.count(static("presence/presence.css")) == 1
    admin = make_user("root", is_staff=True, is_superuser=True)
    page = _client(admin).get(_user_admin_url("change", staff.pk)).content.decode()
    assert link in page
    seen = _client(admin).get(reverse("admin:presence_lastseen_changelist")).content.decode()
    assert link in seen


# --- 6: true presence for moderators, in the admin only -----------------------------------------


def test_the_permission_is_declared_by_a_migration() -> None:
    permission = Permission.objects.get(codename="view_true_presence")
    assert permission.content_type.app_label == "presence"
    assert permission.content_type.model == "lastseen"


def test_a_moderator_granted_true_presence_sees_hidden_users_online(
    hidden: dict[str, Any], make_user: Callable[..., Any]
) -> None:
    moderator = _staff(make_user, "moderator", "view_true_presence")
    assert moderator.has_perm("presence.view_true_presence")
    client = _client(moderator)
    html = client.get(_user_admin_url("changelist")).content.decode()
    for name in ("secret", "ghost", "public"):
        row = _row(html, hidden[name])
        assert 'presence-dot--online"' in row and "online</td>" in row, name
    assert "invisible" in _row(html, hidden["ghost"])
    assert "invisible" not in _row(html, hidden["secret"])
    # The "online now" filter finds them all.
    online = client.get(_user_admin_url("changelist"), {"online": "now"}).content.decode()
    assert all(_row(online, user) for user in hidden.values())
    assert not _row(online, moderator)


def test_a_moderator_granted_true_presence_still_sees_privacy_outside_the_admin(
    hidden: dict[str, Any], make_user: Callable[..., Any]
) -> None:
    moderator = _staff(make_user, "moderator", "view_true_presence")
    secret, ghost = hidden["secret"], hidden["ghost"]
    for target in (secret, ghost):
        presence = api.get_presence(target, moderator)
        assert presence.status == "offline" and presence.last_seen is None
    assert api.online_now(moderator) == [hidden["public"].pk]
    assert async_to_sync(api.aonline_now)(moderator) == [hidden["public"].pk]
    request = RequestFactory().get("/")
    request.user = moderator
    html = Template("{% load presence %}{% presence_dot a %}{% presence_dot b %}").render(
        Context({"request": request, "a": secret, "b": ghost})
    )
    assert html.count("presence-dot--offline") == 2 and "presence-dot--online" not in html
    response = _client(moderator).get(
        reverse("presence:presence"), {"users": f"{secret.pk},{ghost.pk}"}
    )
    assert response.status_code == 200
    assert {p["status"] for p in response.json()["presences"].values()} == {"offline"}
    assert {p["last_seen"] for p in response.json()["presences"].values()} == {None}
    # Anonymous and other users are unaffected too.
    assert not api.get_presence(ghost, AnonymousUser()).is_online


def test_staff_without_the_permission_see_what_privacy_allows(
    hidden: dict[str, Any], make_user: Callable[..., Any]
) -> None:
    staff = _staff(make_user, "staff")
    friend_of = make_user("friendly")
    Contact.objects.create(owner=friend_of, contact=staff)  # lets staff see them (contacts)
    api.touch(friend_of)
    client = _client(staff)
    html = client.get(_user_admin_url("changelist")).content.decode()
    assert 'presence-dot--offline"' in _row(html, hidden["secret"])
    assert 'presence-dot--offline"' in _row(html, hidden["ghost"])
    assert 'presence-dot--online"' in _row(html, hidden["public"])
    assert 'presence-dot--online"' in _row(html, friend_of)
    online = client.get(_user_admin_url("changelist"), {"online": "now"}).content.decode()
    listed = {name for name, user in hidden.items() if _row(online, user)}
    assert listed == {"public"} and _row(online, friend_of)


def _sortable_by_last_seen(client: Client) -> bool:
    html = client.get(_user_admin_url("changelist")).content.decode()
    at = html.index("column-live_last_seen")
    return "sortable" in html[html.rfind("<th", 0, at) : at]


def test_true_presence_lets_a_moderator_sort_by_last_seen(
    clock: Any, make_user: Callable[..., Any]
) -> None:
    early, late = make_user("early"), make_user("late")  # contacts only: hidden from staff
    LastSeen.objects.create(user=early, seen_at=timezone.now() - timedelta(days=3))
    LastSeen.objects.create(user=late, seen_at=timezone.now() - timedelta(minutes=1))
    assert not _sortable_by_last_seen(_client(_staff(make_user, "staff")))
    moderator = _client(_staff(make_user, "moderator", "view_true_presence"))
    assert _sortable_by_last_seen(moderator)
    page = moderator.get(_user_admin_url("changelist"))
    column = page.context["cl"].list_display.index("live_last_seen")
    listed = moderator.get(_user_admin_url("changelist"), {"o": f"-{column}"}).content.decode()
    assert listed.index(_user_admin_url("change", late.pk)) < listed.index(
        _user_admin_url("change", early.pk)
    )
    # ... and the column shows the true last seen it sorts by.
    row = _row(listed, early)
    assert 'presence-dot--offline"' in row and re.search(r">3\sdays ago</td>", row), row


# --- the "online now" filter while Redis is down ----------------------------------------------


@pytest.mark.parametrize("true_presence", [True, False], ids=["true presence", "privacy allows"])
def test_the_online_now_filter_lists_no_one_and_says_why_while_redis_is_down(
    private_redis: Any, clock: Any, make_user: Callable[..., Any], true_presence: bool
) -> None:
    """A Redis outage never breaks a page: who is online cannot be known, so the filtered lists
    (users, last seen) are empty and a warning says why, instead of a 500."""
    public = make_user("public")
    PrivacySettings.objects.create(user=public, **dict.fromkeys(_FIELDS, "everyone"))
    LastSeen.objects.create(user=public, seen_at=timezone.now() - timedelta(days=1))
    api.touch(public)
    granted = ("view_true_presence",) if true_presence else ()
    client = _client(_staff(make_user, "moderator", "view_lastseen", *granted))
    lists = (_user_admin_url("changelist"), reverse("admin:presence_lastseen_changelist"))
    for url in lists:  # listed while Redis is up
        assert client.get(url, {"online": "now"}).context["cl"].result_count == 1
    private_redis.stop()
    for url in lists:
        response = client.get(url, {"online": "now"})
        assert response.status_code == 200
        assert response.context["cl"].result_count == 0
        assert [message.level_tag for message in response.context["messages"]] == ["warning"]
