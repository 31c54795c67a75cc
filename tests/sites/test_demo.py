"""The demo social site (siteproject.demo): seed command, pages, forms and their cost.

The demo's urls (siteproject/urls.py) serve the tests too; presence runs against the real
test Redis like everywhere else.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from presence import api, lifecycle
from presence.middleware import throttle
from presence.models import Block, Contact, PrivacyException, PrivacySettings, UserStatus
from siteproject.demo import seed
from tests.privacy_cases import count_round_trips
from tests.privacy_page_cases import controls, row_of
from tests.privacy_page_cases import page as settings_page

pytestmark = pytest.mark.django_db

User = get_user_model()


def run_seed(*args: str) -> str:
    out = StringIO()
    call_command("seed_demo", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def demo() -> dict[str, Any]:
    run_seed()
    return {user.username: user for user in User.objects.all()}


def login(client: Any, user: Any) -> None:
    client.force_login(user)


def dot_status(html: str, user: Any) -> str:
    """The status class of ``user``'s first presence dot in ``html``."""
    match = re.search(
        rf'class="presence-dot presence-dot--(\w+)" data-presence-user="{user.pk}"', html
    )
    assert match, f"no presence dot for {user.username}"
    return match.group(1)


def last_seen_text(html: str, user: Any) -> str:
    match = re.search(rf'data-presence-last-seen="{user.pk}">([^<]*)<', html)
    assert match, f"no last-seen element for {user.username}"
    return match.group(1)


def section(html: str, start: str, end: str) -> str:
    return html[html.index(start) : html.index(end, html.index(start))]


def friend_names(user: Any) -> set[str]:
    mine = set(Contact.objects.filter(owner=user).values_list("contact__username", flat=True))
    theirs = set(Contact.objects.filter(contact=user).values_list("owner__username", flat=True))
    return mine & theirs


# --- seed_demo ------------------------------------------------------------------------------


def test_seed_demo_twice_creates_the_same_demo() -> None:
    first = run_seed()
    counts = (User.objects.count(), Contact.objects.count(), Block.objects.count())
    second = run_seed()
    assert (User.objects.count(), Contact.objects.count(), Block.objects.count()) == counts
    assert "alice (created)" in first and "alice (exists)" in second

    for name in seed.DEMO_USERS:
        assert User.objects.get(username=name).check_password(seed.DEMO_PASSWORD)
    admin = User.objects.get(username="admin")
    assert admin.is_superuser and admin.is_staff and admin.check_password(seed.DEMO_PASSWORD)

    users = {u.username: u for u in User.objects.all()}
    for a, b in seed.FRIENDS:
        assert b in friend_names(users[a]) and a in friend_names(users[b])
    for follower, followed in seed.FOLLOWS:
        assert Contact.objects.filter(owner=users[follower], contact=users[followed]).exists()
        assert not Contact.objects.filter(owner=users[followed], contact=users[follower]).exists()
    for owner, contact in seed.CLOSE_FRIENDS:
        assert Contact.objects.get(owner=users[owner], contact=users[contact]).close_friend
    for blocker, blocked in seed.BLOCKS:
        assert Block.objects.filter(blocker=users[blocker], blocked=users[blocked]).exists()
    for name, fields in seed.PRIVACY.items():
        settings_row = PrivacySettings.objects.get(user=users[name])
        assert {key: getattr(settings_row, key) for key in fields} == fields
    assert "Demo ready" in second


def test_seed_demo_again_keeps_the_demo_users_logged_in(client: Any) -> None:
    # getting-started suggests `seed_demo --online bob carol` during a demo: a new password
    # hash would end every demo user's session (and close their sockets).
    run_seed()
    client.post(reverse("demo:login"), {"username": "alice", "password": seed.DEMO_PASSWORD})
    assert client.get(reverse("demo:home")).status_code == 200
    run_seed("--online", "bob")
    assert client.get(reverse("demo:home")).status_code == 200

    # A password changed meanwhile is set back to the printed one (which then works).
    alice = User.objects.get(username="alice")
    alice.set_password("something-else")
    alice.save()
    run_seed()
    alice.refresh_from_db()
    assert alice.check_password(seed.DEMO_PASSWORD)


def test_seed_demo_statuses_follow_privacy(demo: dict[str, Any]) -> None:
    # carol's status is for contacts (alice is one); bob's for close friends (alice only).
    alice, bob, carol = demo["alice"], demo["bob"], demo["carol"]
    assert api.get_presence(carol, alice).text == seed.STATUSES["carol"][1]
    assert api.get_presence(bob, alice).emoji == seed.STATUSES["bob"][2]
    assert api.get_presence(bob, carol).text is None
    # dave hides his last seen from everyone; erin shows hers to everyone.
    assert api.get_presence(demo["dave"], alice).last_seen is None
    assert api.get_presence(demo["erin"], demo["frank"]).last_seen is not None


def test_seed_demo_online_marks_users_online(demo: dict[str, Any]) -> None:
    assert api.get_presence(demo["carol"], demo["alice"]).status == "offline"
    out = run_seed("--online", "carol")
    assert "online   carol" in out
    assert api.get_presence(demo["carol"], demo["alice"]).status == "online"


def test_seed_demo_rejects_unknown_online_user() -> None:
    with pytest.raises(CommandError, match="zed"):
        run_seed("--online", "zed")


# --- login and access -----------------------------------------------------------------------


def test_login_page_lists_demo_users_and_password(client: Any) -> None:
    response = client.get(reverse("demo:login"))
    assert response.status_code == 200
    html = response.content.decode()
    hint = section(html, 'data-testid="demo-hint"', "</div>")
    for name in seed.DEMO_USERS:
        assert f'data-demo-user="{name}"' in hint
    assert seed.DEMO_PASSWORD in hint


def test_login_with_demo_password_goes_home(client: Any, demo: dict[str, Any]) -> None:
    response = client.post(
        reverse("demo:login"), {"username": "alice", "password": seed.DEMO_PASSWORD}
    )
    assert response.status_code == 302 and response.url == reverse("demo:home")
    assert client.get(reverse("demo:home")).context["user"] == demo["alice"]


def test_logout_is_a_post(client: Any, demo: dict[str, Any]) -> None:
    login(client, demo["alice"])
    assert client.get(reverse("demo:logout")).status_code == 405
    response = client.post(reverse("demo:logout"))
    assert response.status_code == 302 and response.url == reverse("demo:login")
    assert client.get(reverse("demo:home")).status_code == 302


@pytest.mark.parametrize(
    "url",
    [
        reverse("demo:home"),
        reverse("demo:people"),
        reverse("demo:profile", args=["alice"]),
        reverse("presence:settings"),
    ],
)
def test_pages_send_anonymous_visitors_to_login(client: Any, url: str) -> None:
    response = client.get(url)
    assert response.status_code == 302
    assert response.url == f"{reverse('demo:login')}?next={url}"


def test_actions_send_anonymous_visitors_to_login(client: Any, demo: dict[str, Any]) -> None:
    contacts = Contact.objects.count()
    response = client.post(reverse("demo:relation", args=[demo["bob"].pk, "follow"]))
    assert response.status_code == 302 and response.url.startswith(reverse("demo:login"))
    assert Contact.objects.count() == contacts


# --- pages ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,args",
    [
        ("demo:home", []),
        ("demo:people", []),
        ("demo:profile", ["bob"]),
        ("demo:profile", ["alice"]),
        ("presence:settings", []),
    ],
)
def test_every_page_renders_with_presence_assets(
    client: Any, demo: dict[str, Any], name: str, args: list[str]
) -> None:
    login(client, demo["alice"])
    response = client.get(reverse(name, args=args))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'src="/static/presence/presence.js"' in html
    assert f'data-presence-endpoint="{reverse("presence:presence")}"' in html
    assert 'href="/static/presence/presence.css"' in html
    # The header shows the viewer's own dot.
    assert f'data-presence-user="{demo["alice"].pk}"' in html


def test_home_lists_friends_with_dots_and_last_seen(client: Any, demo: dict[str, Any]) -> None:
    alice = demo["alice"]
    login(client, alice)
    html = client.get(reverse("demo:home")).content.decode()
    friends = section(html, 'data-testid="friends"', "</ul>")
    for name in friend_names(alice):
        assert f'data-presence-user="{demo[name].pk}"' in friends
        assert f'data-presence-last-seen="{demo[name].pk}"' in friends
    # erin follows alice without being followed back: not a friend, offered a follow back.
    assert f'data-presence-user="{demo["erin"].pk}"' not in friends
    following = section(html, "Following you", "</ul>")
    assert "@erin" in following and "Follow back" in following
    # dave hides his last seen (all but the day shows); erin shows hers to everyone.
    assert last_seen_text(html, demo["dave"]) == "last seen recently"
    assert last_seen_text(html, demo["erin"]).replace("\xa0", " ") == "3 days ago"


def test_home_sidebar_shows_online_friends_only(client: Any, demo: dict[str, Any]) -> None:
    api.touch(demo["bob"])
    api.touch(demo["erin"])  # online, but not alice's friend
    login(client, demo["alice"])
    html = client.get(reverse("demo:home")).content.decode()
    sidebar = section(html, '<aside class="layout__side', "</aside>")
    # The live list (online_friends_list) also holds offline friends, hidden, so that
    # presence.js can show them when they come online; strangers are never in it.
    shown = [item for item in re.findall(r"<li [^>]*>.*?</li>", sidebar) if " hidden>" not in item]
    assert len(shown) == 1 and "Bob Brown" in shown[0]
    assert "Carol Chen" in sidebar and "Erin Endo" not in sidebar
    assert "data-presence-friends-count>1</span>" in sidebar
    # bob chose do not disturb; alice sees it on every dot of him.
    assert dot_status(sidebar, demo["bob"]) == "dnd"
    assert dot_status(html, demo["carol"]) == "offline"
    assert last_seen_text(html, demo["bob"]) == "online"


def test_profile_shows_custom_status_as_privacy_allows(client: Any, demo: dict[str, Any]) -> None:
    # bob shares his status with close friends: he marked alice, not carol.
    url = reverse("demo:profile", args=["bob"])
    login(client, demo["alice"])
    html = client.get(url).content.decode()
    assert seed.STATUSES["bob"][1] in html
    login(client, demo["carol"])
    html = client.get(url).content.decode()
    assert seed.STATUSES["bob"][1] not in html
    assert "No status to show." in html


def test_profile_of_unknown_user_is_404(client: Any, demo: dict[str, Any]) -> None:
    login(client, demo["alice"])
    assert client.get(reverse("demo:profile", args=["nobody-here"])).status_code == 404


def test_people_lists_everyone_else_with_relations(client: Any, demo: dict[str, Any]) -> None:
    login(client, demo["bob"])
    html = client.get(reverse("demo:people")).content.decode()
    people = section(html, 'data-testid="people"', "</ul>")
    others = User.objects.exclude(username="bob")
    for user in others:
        assert f'data-presence-user="{user.pk}"' in people
    assert f'data-presence-user="{demo["bob"].pk}"' not in people
    # bob blocked frank: offered an unblock, not a follow.
    frank_row = section(people, 'href="/u/frank/"', "</li>")
    assert "Unblock" in frank_row and ">Follow<" not in frank_row
    assert "Close friend" in section(people, 'href="/u/alice/"', "</li>")


def test_people_search_filters(client: Any, demo: dict[str, Any]) -> None:
    login(client, demo["alice"])
    html = client.get(reverse("demo:people"), {"q": "car"}).content.decode()
    people = section(html, 'data-testid="people"', "</ul>")
    assert "@carol" in people and "@bob" not in people


# --- relation actions -----------------------------------------------------------------------


def post_action(client: Any, target: Any, action: str, **data: str) -> Any:
    return client.post(reverse("demo:relation", args=[target.pk, action]), data)


def test_follow_and_unfollow(client: Any, demo: dict[str, Any]) -> None:
    alice, erin = demo["alice"], demo["erin"]
    login(client, alice)
    response = post_action(client, erin, "follow", next="/people/?q=e")
    assert response.status_code == 302 and response.url == "/people/?q=e"
    assert Contact.objects.filter(owner=alice, contact=erin).exists()
    assert "erin" in friend_names(alice)  # erin already followed alice
    post_action(client, erin, "follow")  # twice is fine
    assert Contact.objects.filter(owner=alice, contact=erin).count() == 1
    post_action(client, erin, "unfollow")
    assert not Contact.objects.filter(owner=alice, contact=erin).exists()
    assert Contact.objects.filter(owner=erin, contact=alice).exists()  # hers stays


def test_close_friend_marks_and_unmarks(client: Any, demo: dict[str, Any]) -> None:
    alice, carol, frank = demo["alice"], demo["carol"], demo["frank"]
    login(client, alice)
    post_action(client, carol, "close-friend")
    assert Contact.objects.get(owner=alice, contact=carol).close_friend
    post_action(client, carol, "unclose-friend")
    contact = Contact.objects.get(owner=alice, contact=carol)
    assert contact.close_friend is False  # still a contact
    post_action(client, frank, "close-friend")  # marking someone not followed follows them
    assert Contact.objects.get(owner=alice, contact=frank).close_friend


def test_block_hides_presence_both_ways_and_unblock_restores(
    client: Any, demo: dict[str, Any]
) -> None:
    alice, carol = demo["alice"], demo["carol"]
    api.touch(carol)
    login(client, alice)
    assert dot_status(client.get(reverse("demo:home")).content.decode(), carol) == "online"
    post_action(client, carol, "block")
    assert Block.objects.filter(blocker=alice, blocked=carol).exists()
    # Nothing else to call: privacy is computed on read.
    html = client.get(reverse("demo:home")).content.decode()
    assert dot_status(html, carol) == "offline"
    assert last_seen_text(html, carol) == ""
    assert api.get_presence(alice, carol).status == "offline"
    post_action(client, carol, "unblock")
    assert not Block.objects.filter(blocker=alice, blocked=carol).exists()
    assert dot_status(client.get(reverse("demo:home")).content.decode(), carol) == "online"


def test_actions_reject_self_unknown_get_and_unsafe_next(client: Any, demo: dict[str, Any]) -> None:
    alice, bob = demo["alice"], demo["bob"]
    login(client, alice)
    assert post_action(client, alice, "follow").status_code == 400
    assert not Contact.objects.filter(owner=alice, contact=alice).exists()
    assert post_action(client, bob, "poke").status_code == 404
    assert client.get(reverse("demo:relation", args=[bob.pk, "block"])).status_code == 405
    assert not Block.objects.filter(blocker=alice).exists()
    response = post_action(client, bob, "unfollow", next="https://evil.example/")
    assert response.status_code == 302 and response.url == reverse("demo:people")


def test_actions_need_csrf_token(demo: dict[str, Any]) -> None:
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(demo["alice"])
    assert post_action(client, demo["frank"], "follow").status_code == 403
    assert not Contact.objects.filter(owner=demo["alice"], contact=demo["frank"]).exists()


# --- privacy settings: presence's ready page (presence:settings) in the demo's layout -------


def test_the_demo_links_to_presences_settings_page_in_its_own_layout(
    client: Any, demo: dict[str, Any]
) -> None:
    alice = demo["alice"]
    login(client, alice)
    settings_url = reverse("presence:settings")
    for page_url in (reverse("demo:home"), reverse("demo:profile", args=["alice"])):
        assert f'href="{settings_url}"' in client.get(page_url).content.decode()
    response = client.get(settings_url)
    assert response.status_code == 200
    html = response.content.decode()
    # templates/presence/base.html extends the demo's base: its title, styles and header.
    assert "<title>Privacy and status · Circle</title>" in html
    assert 'href="/static/demo/site.css"' in html
    assert f'<a href="{settings_url}" aria-current="page">Privacy</a>' in html
    assert html.count("<h1>") == 1 and "<h1>Privacy and status</h1>" in html
    # The demo's former privacy page leads there.
    old = client.get("/settings/privacy/")
    assert old.status_code == 302 and old.url == settings_url
    assert not PrivacySettings.objects.filter(user=alice).exists()


def test_the_privacy_page_saves_and_applies(client: Any, demo: dict[str, Any]) -> None:
    alice, bob, erin = demo["alice"], demo["bob"], demo["erin"]
    api.touch(alice)
    assert api.get_presence(alice, erin).status == "offline"  # erin is not alice's contact
    login(client, alice)
    values = settings_page(client)
    values.update(
        {
            "online_visibility": "everyone",
            "last_seen_visibility": "close_friends",
            "activity_visibility": "nobody",
        }
    )
    response = client.post(reverse("presence:settings"), values)
    assert response.status_code == 302
    row = PrivacySettings.objects.get(user=alice)
    assert (row.online_visibility, row.last_seen_visibility, row.activity_visibility) == (
        "everyone",
        "close_friends",
        "nobody",
    )
    assert row.invisible is False
    assert api.get_presence(alice, erin).status == "online"
    # bob is alice's contact but no close friend of hers: no last seen for him.
    assert api.get_presence(alice, bob).last_seen is None
    # The saved message shows in the demo's flash list.
    assert "Your settings are saved." in client.get(reverse("demo:home")).content.decode()

    values = settings_page(client)
    values.update({"status": "invisible", f"{row_of(values, bob)}-online_visibility": "never"})
    assert client.post(reverse("presence:settings"), values).status_code == 302
    assert api.get_presence(alice, erin).status == "offline"
    assert PrivacySettings.objects.filter(user=alice).count() == 1
    assert PrivacyException.objects.get(owner=alice).viewer == bob


# --- HTTP_RATE_LIMIT on every demo form ---------------------------------------------------------


def assert_limited_page(response: Any, retry_after: int) -> None:
    assert response.status_code == 429
    assert response["Retry-After"] == str(retry_after)
    assert f"try again in {retry_after} seconds" in response.content.decode()


def test_follow_and_block_actions_are_rate_limited(
    client: Any, demo: dict[str, Any], settings: Any, clock: time_machine.Coordinates
) -> None:
    settings.PRESENCE = {"HTTP_RATE_LIMIT": (2, 60)}
    alice, erin = demo["alice"], demo["erin"]
    login(client, alice)
    assert post_action(client, erin, "follow").status_code == 302
    assert post_action(client, erin, "close-friend").status_code == 302
    assert_limited_page(post_action(client, erin, "block"), retry_after=60)
    assert_limited_page(post_action(client, erin, "unfollow"), retry_after=60)
    assert not Block.objects.filter(blocker=alice, blocked=erin).exists()
    assert Contact.objects.get(owner=alice, contact=erin).close_friend is True
    # A refused action is no write: bad requests are still answered as before.
    assert post_action(client, alice, "follow").status_code == 400
    assert post_action(client, erin, "explode").status_code == 404
    clock.shift(60)
    assert post_action(client, erin, "block").status_code == 302
    assert Block.objects.filter(blocker=alice, blocked=erin).exists()


# --- status: the settings page's status section (presence's one StatusForm) ----------------

STATUS_SECTION = f"{reverse('presence:settings')}#presence-settings-status"


def status_page(client: Any) -> Any:
    """The page the demo's Status (in its header's nav) leads to."""
    nav = section(client.get(reverse("demo:home")).content.decode(), '<nav class="nav"', "</nav>")
    link = re.search(r'<a href="([^"]*)"[^>]*>Status</a>', nav)
    assert link, nav
    response = client.get(link.group(1), follow=True)
    assert response.status_code == 200
    return response


def status_form(response: Any) -> str:
    """The form of the page's content (not the header's status menu) that sets the status."""
    html = response.content.decode()
    forms = re.findall(r"<form.*?</form>", html[html.index("<main") :], re.S)
    return next(form for form in forms if 'name="expires"' in form)


def offered(response: Any) -> list[str]:
    """The clearing times the page's status form offers."""
    select = re.search(r'<select name="expires".*?</select>', status_form(response), re.S)
    assert select
    return re.findall(r'<option value="([^"]*)"', select.group())


def post_status(client: Any, **fields: str) -> Any:
    """The Status page's form, as a browser submits it with ``fields`` changed."""
    page = status_page(client)
    return client.post(page.request["PATH_INFO"], {**controls(status_form(page)).values, **fields})


def test_the_demos_status_is_the_settings_pages_status_section(
    client: Any, demo: dict[str, Any]
) -> None:
    # The demo has no status form of its own: one form decides the choices (presence.pages).
    login(client, demo["alice"])
    for page_url in (reverse("demo:home"), reverse("demo:profile", args=["alice"])):
        html = client.get(page_url).content.decode()
        assert f'<a href="{STATUS_SECTION}">Status</a>' in html  # the nav
        assert f'<a class="btn" href="{STATUS_SECTION}">Set status</a>' in html
    page = status_page(client)
    assert page.templates[0].name == "presence/settings.html"
    html = page.content.decode()
    assert '<h2 id="presence-settings-status">Your status</h2>' in html
    assert "<title>Privacy and status · Circle</title>" in html  # in the demo's layout
    # The demo's former status page leads there.
    old = client.get("/settings/status/")
    assert old.status_code == 302 and old.url == STATUS_SECTION


def test_status_sets_status_through_the_api(client: Any, demo: dict[str, Any]) -> None:
    alice, bob = demo["alice"], demo["bob"]
    login(client, alice)  # logging in records activity: alice is online
    start = datetime.now(tz=UTC)
    with time_machine.travel(start, tick=False):
        response = post_status(client, status="dnd", emoji="🎧", text="Focus time", expires="1h")
        assert response.status_code == 302 and response.url == reverse("presence:settings")
        seen_by_bob = api.get_presence(alice, bob)
        assert (seen_by_bob.status, seen_by_bob.emoji, seen_by_bob.text) == (
            "dnd",
            "🎧",
            "Focus time",
        )
        # The form shows the current choice again, under the saved message.
        page = client.get(response.url)
        assert "Your settings are saved." in page.content.decode()
        form = page.context["status"]
        shown = [form[name].value() for name in ("status", "emoji", "text", "expires")]
        assert shown == ["dnd", "🎧", "Focus time", "keep"]
    with time_machine.travel(start + timedelta(hours=1, seconds=1), tick=False):
        expired = api.get_presence(alice, alice)
        assert expired.text is None and expired.emoji is None


def test_saving_the_status_again_keeps_when_the_custom_status_clears(
    client: Any, demo: dict[str, Any]
) -> None:
    alice = demo["alice"]
    login(client, alice)
    start = datetime.now(tz=UTC).replace(microsecond=0)
    with time_machine.travel(start, tick=False):
        post_status(client, status="auto", text="Lunch", expires="30m")
        clears = start + timedelta(minutes=30)
        assert UserStatus.objects.get(user=alice).expires_at == clears
        # The page offers the time as set, chosen.
        assert controls(status_form(status_page(client))).values["expires"] == "keep"
    with time_machine.travel(start + timedelta(minutes=5), tick=False):
        response = post_status(client, status="dnd")
        assert response.status_code == 302
        assert UserStatus.objects.get(user=alice).expires_at == clears
        assert api.get_presence(alice, alice).status == "dnd"


@pytest.mark.parametrize(
    ("max_expiry", "choices"),
    [
        (2 * 3600, ["30m", "1h", "never"]),
        (14 * 3600, ["30m", "1h", "4h", "never"]),  # midnight (UTC) is 14.5 hours away
        (15 * 3600, ["30m", "1h", "4h", "today", "never"]),
    ],
)
def test_the_status_page_offers_only_the_clearing_times_the_site_allows(
    client: Any,
    demo: dict[str, Any],
    settings: Any,
    clock: time_machine.Coordinates,
    max_expiry: int,
    choices: list[str],
) -> None:
    settings.PRESENCE = {"MAX_STATUS_EXPIRY": max_expiry}
    login(client, demo["alice"])
    assert offered(status_page(client)) == choices


def test_at_midnight_clears_at_the_next_midnight_of_the_time_zone(
    client: Any, demo: dict[str, Any], settings: Any, clock: time_machine.Coordinates
) -> None:
    settings.TIME_ZONE = "Asia/Tokyo"  # T0, 09:30 UTC, is 18:30 there
    settings.PRESENCE = {"MAX_STATUS_EXPIRY": 6 * 3600}
    alice = demo["alice"]
    login(client, alice)
    assert post_status(client, text="Dinner", expires="today").status_code == 302
    assert UserStatus.objects.get(user=alice).expires_at == datetime(2030, 1, 7, 15, tzinfo=UTC)


def test_status_too_long_text_shows_the_error_on_the_field_and_saves_nothing(
    client: Any, demo: dict[str, Any]
) -> None:
    alice = demo["alice"]
    login(client, alice)
    limit = lifecycle.limits().text_max_length
    response = post_status(client, status="invisible", text="x" * (limit + 1))
    assert response.status_code == 200
    assert list(response.context["status"].errors) == ["text"]
    assert f"at most {limit} characters" in response.context["status"].errors["text"][0]
    assert f"at most {limit} characters" in response.content.decode()
    assert not UserStatus.objects.filter(user=alice).exists()
    assert not PrivacySettings.objects.filter(user=alice, invisible=True).exists()
    assert api.get_presence(alice, alice).invisible is False


def test_status_invisible_hides_from_friends(client: Any, demo: dict[str, Any]) -> None:
    alice, bob = demo["alice"], demo["bob"]
    login(client, alice)
    assert api.get_presence(alice, bob).status == "online"
    post_status(client, status="invisible")
    assert api.get_presence(alice, bob).status == "offline"
    assert api.get_presence(alice, alice).invisible is True


def test_status_writes_are_rate_limited(
    client: Any, demo: dict[str, Any], settings: Any, clock: time_machine.Coordinates
) -> None:
    settings.PRESENCE = {"HTTP_RATE_LIMIT": (1, 60)}
    alice = demo["alice"]
    login(client, alice)
    assert post_status(client, status="dnd", text="busy").status_code == 302
    refused = post_status(client, status="auto", text="again")
    assert_limited_page(refused, retry_after=60)
    assert UserStatus.objects.get(user=alice).text == "busy"


# --- cost -----------------------------------------------------------------------------------


def make_friends(owner: Any, count: int, make_user: Any) -> list[Any]:
    friends = [make_user() for _ in range(count)]
    Contact.objects.bulk_create(
        [Contact(owner=owner, contact=f) for f in friends]
        + [Contact(owner=f, contact=owner) for f in friends]
    )
    for friend in friends[::2]:  # half of them online, for the sidebar
        api.touch(friend)
    return friends


def home_cost(client: Any, user: Any) -> tuple[int, int, str]:
    throttle.mark(user.pk)  # this request's own activity write is the middleware's business
    with CaptureQueriesContext(connection) as queries, count_round_trips() as trips:
        response = client.get(reverse("demo:home"))
    assert response.status_code == 200
    return len(queries), trips.count, response.content.decode()


def test_home_costs_the_same_for_few_and_many_friends(
    client: Any, make_user: Any, django_assert_max_num_queries: Any
) -> None:
    few_owner, many_owner = make_user(), make_user()
    few = make_friends(few_owner, 2, make_user)
    many = make_friends(many_owner, 40, make_user)

    client.force_login(few_owner)
    few_queries, few_trips, few_html = home_cost(client, few_owner)
    client.force_login(many_owner)
    many_queries, many_trips, many_html = home_cost(client, many_owner)

    # The pages did show all friends, half of them online.
    assert all(f'data-presence-user="{f.pk}"' in many_html for f in many)
    assert all(f'data-presence-user="{f.pk}"' in few_html for f in few)
    assert len(re.findall(r'presence-dot--online" data-presence-user', many_html)) >= 20
    assert (many_queries, many_trips) == (few_queries, few_trips)
    # Session, user, friends, followers, own presence, page prefetch, the live online-friends
    # list (friend ids; the online ones' facts and rows; the others' facts and rows: 3), the
    # header's status menu (the user's status and privacy rows, in one).
    with django_assert_max_num_queries(10):
        client.get(reverse("demo:home"))
    assert many_trips <= 4  # own presence, page prefetch, online friends, watched friends


# --- text the database cannot store, or that misleads readers -------------------------------


@pytest.mark.parametrize("query", ["\x00", "car\x00ol", "\u202e"])
def test_people_search_refuses_nul_and_controls_with_400(
    client: Any, demo: dict[str, Any], query: str
) -> None:
    login(client, demo["alice"])
    assert client.get(reverse("demo:people"), {"q": query}).status_code == 400


@pytest.mark.parametrize("path", ["/u/bo%00b/", "/u/%00/", "/u/bob%E2%80%AE/"])
def test_profile_url_with_nul_or_controls_is_400(
    client: Any, demo: dict[str, Any], path: str
) -> None:
    login(client, demo["alice"])
    assert client.get(path).status_code == 400


@pytest.mark.parametrize("field", ["text", "emoji"])
@pytest.mark.parametrize("bad", ["a\x00b", "x\u202ey"])
def test_status_refuses_nul_and_controls_and_saves_nothing(
    client: Any, demo: dict[str, Any], field: str, bad: str
) -> None:
    alice = demo["alice"]
    login(client, alice)
    response = post_status(client, status="dnd", **{field: bad})
    assert response.status_code == 200
    assert list(response.context["status"].errors) == [field]
    assert not UserStatus.objects.filter(user=alice).exists()


# --- privacy reaches open sockets -----------------------------------------------------------


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> Any:
    from tests.live.sockets import open_sockets

    async for opened in open_sockets():
        yield opened


@pytest.mark.django_db(transaction=True)
async def test_removing_a_close_friend_reaches_their_open_socket(
    sockets: Any, settings: Any, make_user: Any
) -> None:
    # The former close friend stops seeing "secret plans" at once, without reloading.
    from asgiref.sync import sync_to_async
    from django.test import Client

    from tests.live.sockets import BASE, receive, subscribe

    settings.PRESENCE = dict(BASE)
    alice, carol = await sync_to_async(make_user)(), await sync_to_async(make_user)()

    @sync_to_async
    def arrange() -> None:
        Contact.objects.create(owner=alice, contact=carol, close_friend=True)
        PrivacySettings.objects.create(user=alice, activity_visibility="close_friends")
        api.set_status(alice, "auto", text="secret plans")

    await arrange()
    await sockets.open(alice)  # online through a live connection
    carol_tab = await sockets.open(carol)
    snapshot = (await subscribe(carol_tab, alice))["presences"][str(alice.pk)]
    assert (snapshot["status"], snapshot["text"]) == ("online", "secret plans")

    client = Client()
    await sync_to_async(client.force_login)(alice)
    response = await sync_to_async(client.post)(
        reverse("demo:relation", args=[carol.pk, "unclose-friend"])
    )
    assert response.status_code == 302
    changed = await receive(carol_tab)
    assert changed["type"] == "presence_diff"
    seen = changed["presences"][str(alice.pk)]
    assert (seen["status"], seen["text"]) == ("online", None)  # still a contact


def test_the_demo_runs_under_a_strict_content_security_policy(client: Any, make_user: Any) -> None:
    """script-src 'self' plus the response's nonce, which presence_script carries; the
    browser tests fail on any violation (a console error)."""
    import re

    client.force_login(make_user("csp"))
    response = client.get("/")
    policy = response["Content-Security-Policy"]
    nonce = re.search(r"script-src 'self' 'nonce-([^']+)'", policy)
    assert nonce is not None, policy
    assert "unsafe-inline" not in policy
    html = response.content.decode()
    assert 'data-presence-labels="' in html and f'nonce="{nonce.group(1)}"></script>' in html
    assert not re.search(r"<[^>]*\son[a-z]+\s*=", html)  # no inline event handlers
