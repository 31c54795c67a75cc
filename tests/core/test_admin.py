"""The admin: presence models are listed, searchable, editable; privacy is on the User page."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from presence import api
from presence.models import Block, Contact, LastSeen, PrivacySettings, UserStatus

pytestmark = pytest.mark.django_db

SEEN_AT = datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC)


class _FormValues(HTMLParser):
    """The values a browser would submit for the page's main form (no JavaScript)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, Any] = {}
        self._select: str | None = None
        self._multiple = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name and "__prefix__" not in name:
            kind = a.get("type", "text")
            if kind in {"submit", "button"}:
                return
            if kind == "checkbox":
                if "checked" in a:
                    self.values[name] = "on"
                return
            self.values[name] = a.get("value") or ""
        elif tag == "select" and name and "__prefix__" not in name:
            self._select = name
            self._multiple = "multiple" in a
            if not self._multiple:  # a multiple select with nothing selected sends nothing
                self.values.setdefault(name, "")
        elif tag == "option" and self._select and "selected" in a:
            value = a.get("value") or ""
            if self._multiple:
                self.values.setdefault(self._select, []).append(value)
            else:
                self.values[self._select] = value

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None


def form_values(html: str) -> dict[str, Any]:
    parser = _FormValues()
    parser.feed(html)
    values = parser.values
    values.pop("csrfmiddlewaretoken", None)
    return values


@pytest.fixture
def people(make_user: Callable[..., Any]) -> dict[str, Any]:
    alice = make_user("alice", email="alice@example.com", first_name="Alice")
    bob = make_user("bob", email="bob@example.com", first_name="Bob")
    carol = make_user("carol")
    PrivacySettings.objects.create(user=alice, online_visibility="everyone")
    PrivacySettings.objects.create(user=bob, invisible=True)
    UserStatus.objects.create(user=alice, text="Sailing", emoji="⛵")
    UserStatus.objects.create(user=bob, dnd=True, text="Deep work")
    Contact.objects.create(owner=alice, contact=carol, close_friend=True)
    Contact.objects.create(owner=bob, contact=carol)
    Block.objects.create(blocker=alice, blocked=carol)
    Block.objects.create(blocker=bob, blocked=carol)
    LastSeen.objects.create(user=alice, seen_at=SEEN_AT)
    LastSeen.objects.create(user=bob, seen_at=SEEN_AT)
    return {"alice": alice, "bob": bob, "carol": carol}


@pytest.fixture
def admin_client(make_user: Callable[..., Any]) -> Client:
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


MODELS = ["privacysettings", "userstatus", "contact", "block", "lastseen"]


@pytest.mark.parametrize("model", MODELS)
def test_changelist_renders_and_searches(
    model: str, admin_client: Client, people: dict[str, Any]
) -> None:
    url = f"/admin/presence/{model}/"
    everything = admin_client.get(url)
    assert everything.status_code == 200
    assert "2 total" not in everything.content.decode()
    found = admin_client.get(url, {"q": "alice"})
    assert found.status_code == 200
    page = found.content.decode()
    # One of the two rows matches; Django says so in the search summary.
    assert "1 result" in page
    assert "2 total" in page
    by_email = admin_client.get(url, {"q": "bob@example"}).content.decode()
    assert "1 result" in by_email


def test_user_status_search_covers_the_text(admin_client: Client, people: dict[str, Any]) -> None:
    page = admin_client.get("/admin/presence/userstatus/", {"q": "deep work"}).content.decode()
    assert "1 result" in page
    assert "Deep work" in page


@pytest.mark.parametrize("model", MODELS)
def test_change_pages_render(model: str, admin_client: Client, people: dict[str, Any]) -> None:
    alice = people["alice"]
    pk = {
        "privacysettings": alice.pk,
        "userstatus": alice.pk,
        "contact": Contact.objects.get(owner=alice).pk,
        "block": Block.objects.get(blocker=alice).pk,
        "lastseen": alice.pk,
    }[model]
    assert admin_client.get(f"/admin/presence/{model}/{pk}/change/").status_code == 200


@pytest.mark.parametrize("model", ["privacysettings", "userstatus", "contact", "block"])
def test_add_pages_render(model: str, admin_client: Client) -> None:
    assert admin_client.get(f"/admin/presence/{model}/add/").status_code == 200


def test_last_seen_is_read_only(admin_client: Client, people: dict[str, Any]) -> None:
    assert admin_client.get("/admin/presence/lastseen/add/").status_code == 403
    page = admin_client.get(f"/admin/presence/lastseen/{people['alice'].pk}/change/")
    assert 'name="seen_at' not in page.content.decode()


def test_last_seen_before_today_is_read_only(admin_client: Client, people: dict[str, Any]) -> None:
    # prior_seen_at is presence's own record (the approximate last seen counts from it), as
    # seen_at is: on LastSeen's page and in the user page's inline.
    alice = people["alice"]
    prior = SEEN_AT - timedelta(days=2)
    LastSeen.objects.filter(user=alice).update(prior_seen_at=prior)
    url = f"/admin/presence/lastseen/{alice.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert 'name="prior_seen_at' not in page
    posted = {"prior_seen_at_0": "2099-01-01", "prior_seen_at_1": "00:00:00"}
    assert admin_client.post(url, posted).status_code == 302
    assert LastSeen.objects.get(user=alice).prior_seen_at == prior
    user_page = admin_client.get(f"/admin/auth/user/{alice.pk}/change/").content.decode()
    assert 'name="presence_last_seen-0-prior_seen_at' not in user_page


@pytest.mark.parametrize("model", ["privacysettings", "userstatus"])
def test_the_user_of_a_saved_row_cannot_be_changed(
    model: str, admin_client: Client, people: dict[str, Any]
) -> None:
    # user is the row's primary key: a changed one saved a copy under the other user and left
    # the row as it was. It is read-only once saved, and chosen on the add page.
    alice, carol = people["alice"], people["carol"]
    rows = {"privacysettings": PrivacySettings, "userstatus": UserStatus}[model].objects
    before = sorted(rows.values_list("user", flat=True))
    url = f"/admin/presence/{model}/{alice.pk}/change/"
    values = form_values(admin_client.get(url).content.decode())
    assert "user" not in values
    values["user"] = str(carol.pk)
    assert admin_client.post(url, values).status_code == 302
    assert sorted(rows.values_list("user", flat=True)) == before  # no copy under carol
    add_page = admin_client.get(f"/admin/presence/{model}/add/").content.decode()
    assert 'name="user"' in add_page


def test_admin_adds_a_contact(admin_client: Client, people: dict[str, Any]) -> None:
    alice, bob = people["alice"], people["bob"]
    response = admin_client.post(
        "/admin/presence/contact/add/",
        {"owner": alice.pk, "contact": bob.pk, "close_friend": "on"},
    )
    assert response.status_code == 302
    assert Contact.objects.get(owner=alice, contact=bob).close_friend is True
    # A duplicate and a self-contact are refused by the form, not by a server error.
    duplicate = admin_client.post(
        "/admin/presence/contact/add/", {"owner": alice.pk, "contact": bob.pk}
    )
    assert duplicate.status_code == 200
    self_contact = admin_client.post(
        "/admin/presence/contact/add/", {"owner": alice.pk, "contact": alice.pk}
    )
    assert self_contact.status_code == 200
    assert Contact.objects.filter(owner=alice).count() == 2


def test_autocomplete_finds_users(admin_client: Client, people: dict[str, Any]) -> None:
    response = admin_client.get(
        "/admin/autocomplete/",
        {"term": "ali", "app_label": "presence", "model_name": "contact", "field_name": "owner"},
    )
    assert response.status_code == 200
    assert [r["id"] for r in response.json()["results"]] == [str(people["alice"].pk)]


def test_user_page_edits_privacy_inline(admin_client: Client, people: dict[str, Any]) -> None:
    carol = people["carol"]
    url = f"/admin/auth/user/{carol.pk}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200
    values = form_values(page.content.decode())
    # A user without a row is shown the defaults.
    assert values["presence_privacy-0-online_visibility"] == "contacts"
    assert "presence_privacy-0-invisible" not in values

    values["presence_privacy-0-online_visibility"] = "close_friends"
    values["presence_privacy-0-last_seen_visibility"] = "nobody"
    values["presence_privacy-0-invisible"] = "on"
    response = admin_client.post(url, values)
    assert response.status_code == 302
    privacy = PrivacySettings.objects.get(user=carol)
    assert (privacy.online_visibility, privacy.last_seen_visibility, privacy.invisible) == (
        "close_friends",
        "nobody",
        True,
    )

    values = form_values(admin_client.get(url).content.decode())
    assert values["presence_privacy-0-online_visibility"] == "close_friends"
    values["presence_privacy-0-online_visibility"] = "everyone"
    values.pop("presence_privacy-0-invisible")
    assert admin_client.post(url, values).status_code == 302
    privacy.refresh_from_db()
    assert (privacy.online_visibility, privacy.invisible) == ("everyone", False)


def test_user_page_shows_last_seen(admin_client: Client, people: dict[str, Any]) -> None:
    page = admin_client.get(f"/admin/auth/user/{people['alice'].pk}/change/").content.decode()
    assert "March 14, 2025" in page
    assert 'name="presence_last_seen-0-seen_at' not in page  # read-only


def test_admin_speaks_japanese(admin_client: Client, people: dict[str, Any]) -> None:
    page = admin_client.get(
        "/admin/presence/privacysettings/", HTTP_ACCEPT_LANGUAGE="ja"
    ).content.decode()
    assert "プライバシー設定" in page
    assert "オンライン状態を表示する相手" in page  # the online_visibility column
    assert "全員" in page  # alice's "everyone"


# --- presence for moderators ----------------------------------------------------------------


def test_presence_does_not_register_the_sites_user_admin() -> None:
    from django.contrib import admin as django_admin

    import presence.admin

    user_admin = django_admin.site.get_model_admin(get_user_model())
    # The demo's own class, which adds presence's mixin itself.
    assert type(user_admin).__module__ == "siteproject.demo.admin"
    assert isinstance(user_admin, presence.admin.PresenceUserAdminMixin)
    assert "_extend_user_admin" not in vars(presence.admin)


def test_user_changelist_shows_status_and_last_seen_as_the_moderator_may_see(
    clock: Any, admin_client: Client, people: dict[str, Any]
) -> None:
    alice, bob = people["alice"], people["bob"]
    api.touch(alice)  # alice lets everyone see her (the people fixture); bob is offline
    page = admin_client.get("/admin/auth/user/").content.decode()
    alice_row = section(page, f'href="/admin/auth/user/{alice.pk}/change/"', "</tr>")
    bob_row = section(page, f'href="/admin/auth/user/{bob.pk}/change/"', "</tr>")
    assert 'presence-dot--online"' in alice_row and "online</td>" in alice_row
    assert 'presence-dot--offline"' in bob_row


def test_the_online_now_filter_and_sorting_by_last_seen(
    clock: Any, admin_client: Client, people: dict[str, Any]
) -> None:
    alice, bob, carol = people["alice"], people["bob"], people["carol"]
    api.touch(alice)
    online = admin_client.get("/admin/auth/user/", {"online": "now"}).content.decode()

    def listed(user: Any) -> bool:  # change links keep the filter: ...change/?_changelist_...
        return re.search(rf'/admin/auth/user/{user.pk}/change/[?"]', online) is not None

    assert listed(alice) and not listed(bob) and not listed(carol)
    seen = admin_client.get("/admin/presence/lastseen/", {"online": "now"})
    assert seen.status_code == 200
    # The last seen column sorts, by the persisted LastSeen (carol has none: last, descending).
    columns = admin_client.get("/admin/auth/user/").content.decode()
    at = columns.index("column-live_last_seen")
    header = columns[columns.rfind("<th", 0, at) : columns.index("</th>", at)]
    assert "sortable" in header
    order = re.search(r'href="\?o=([\d.]+)"', header)
    assert order is not None
    number = order.group(1).split(".")[0]
    descending = admin_client.get("/admin/auth/user/", {"o": f"-{number}"}).content.decode()
    rows = [descending.index(f"/admin/auth/user/{u.pk}/change/") for u in (alice, bob, carol)]
    assert max(rows[:2]) < rows[2]


def section(html: str, start: str, end: str) -> str:
    """The part of ``html`` from ``start`` to the next ``end``."""
    begin = html.index(start)
    return html[begin : html.index(end, begin)]


def test_staff_who_may_not_see_last_seen_cannot_order_users_by_it(
    clock: Any, make_user: Callable[..., Any]
) -> None:
    """Ordering by the true last seen would tell a moderator what the resolver hides from them
    (the order of last seens they may not see): for staff without presence.view_lastseen the
    column does not sort, and an ``?o=`` naming it changes nothing."""
    from django.contrib.auth.models import Permission
    from django.utils import timezone

    staff = make_user("staff", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_user"))
    early, late = make_user("early"), make_user("late")  # contacts only (the default): hidden
    client = Client()
    client.force_login(staff)

    def order(recent: Any, old: Any) -> tuple[list[bool], bool]:
        """Whether early lists before late, sorted up and down; whether the header sorts."""
        LastSeen.objects.update_or_create(
            user=recent, defaults={"seen_at": timezone.now() - timedelta(minutes=1)}
        )
        LastSeen.objects.update_or_create(
            user=old, defaults={"seen_at": timezone.now() - timedelta(days=3)}
        )
        page = client.get("/admin/auth/user/")
        assert page.status_code == 200
        column = page.context["cl"].list_display.index("live_last_seen")
        html = page.content.decode()
        at = html.index("column-live_last_seen")
        sortable = "sortable" in html[html.rfind("<th", 0, at) : at]
        orders = []
        for sort in (f"{column}", f"-{column}"):
            listed = client.get("/admin/auth/user/", {"o": sort}).content.decode()
            early_at, late_at = (
                listed.index(f"/admin/auth/user/{u.pk}/change/") for u in (early, late)
            )
            orders.append(early_at < late_at)
        return orders, sortable

    early_first, sortable = order(early, late)
    assert order(late, early) == (early_first, sortable)
    assert not sortable
