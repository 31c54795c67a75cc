"""The demo's activity feed pages: seed data, timelines with paging, the post box, groups."""

from __future__ import annotations

import re
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from presence import api
from presence.feed import api as feed
from presence.feed.models import Activity, Group, Membership, Mention
from presence.models import Block, Contact, PrivacySettings
from siteproject.demo import seed

pytestmark = pytest.mark.django_db

User = get_user_model()


def run_seed() -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


@pytest.fixture
def demo() -> dict[str, Any]:
    run_seed()
    return {user.username: user for user in User.objects.all()}


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def activity_ids(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'data-activity="(\d+)"', html)]


def older_link(html: str) -> str | None:
    match = re.search(r'rel="next" href="([^"]+)"', html)
    return match.group(1).replace("&amp;", "&") if match else None


# --- seed_demo ------------------------------------------------------------------------------


def test_seed_creates_groups_and_posts_once() -> None:
    first = run_seed()
    counts = (Group.objects.count(), Membership.objects.count(), Activity.objects.count())
    mentions = Mention.objects.count()
    run_seed()
    assert (Group.objects.count(), Membership.objects.count(), Activity.objects.count()) == counts
    assert Mention.objects.count() == mentions
    assert counts == (
        len(seed.GROUPS),
        sum(len(m) for _, _, m in seed.GROUPS.values()),
        len(seed.POSTS),
    )
    assert "group    Book club" in first and "post     carol" in first
    for slug, (name, _, members) in seed.GROUPS.items():
        group = Group.objects.get(slug=slug)
        assert group.name == name
        assert set(group.members.values_list("username", flat=True)) == set(members)
    # Posts keep their order in time, and their mentions were parsed (not the e-mail address).
    texts = list(Activity.objects.order_by("created_at").values_list("text", flat=True))
    assert texts == [text for _, text, _ in seed.POSTS]
    last = Activity.objects.get(text__startswith="Thursday it is")
    assert set(Mention.objects.filter(activity=last).values_list("user__username", flat=True)) == {
        "frank",
        "erin",
    }
    assert all(m.created_at == m.activity.created_at for m in Mention.objects.all())


# --- timelines ------------------------------------------------------------------------------


def test_feed_shows_followed_people_and_me_with_privacy(demo: dict[str, Any]) -> None:
    alice, carol = demo["alice"], demo["carol"]
    page = client_for(alice).get("/feed/")
    assert page.status_code == 200
    html = page.content.decode()
    shown = set(activity_ids(html))
    # alice follows bob, carol, dave; bob shares with close friends only, and alice is one.
    expected = set(
        Activity.objects.filter(author__username__in=["alice", "bob", "carol", "dave"]).values_list(
            "pk", flat=True
        )
    )
    assert shown == expected
    assert '<a class="mention" href="/u/alice/">@alice</a>' in html
    # carol follows bob too, but is not his close friend: none of his posts.
    carol_sees = set(activity_ids(client_for(carol).get("/feed/").content.decode()))
    bobs = set(Activity.objects.filter(author__username="bob").values_list("pk", flat=True))
    assert bobs and not carol_sees & bobs


def test_feed_pages_by_cursor(make_user: Callable[..., Any]) -> None:
    me, friend = make_user("me"), make_user("friend")
    PrivacySettings.objects.create(user=friend, activity_visibility="everyone")
    Contact.objects.create(owner=me, contact=friend)
    posted = [feed.post(friend, f"post {n}").pk for n in range(60)]
    client = client_for(me)
    first = client.get("/feed/").content.decode()
    assert activity_ids(first) == list(reversed(posted))[:50]
    older = older_link(first)
    assert older is not None and older.startswith("/feed/?cursor=")
    second = client.get(older).content.decode()
    assert activity_ids(second) == list(reversed(posted))[50:]
    assert older_link(second) is None
    assert 'href="/feed/">← Newest</a>' in second


def test_a_bad_cursor_goes_back_to_the_first_page(make_user: Callable[..., Any]) -> None:
    client = client_for(make_user())
    for url in ("/feed/", "/feed/mentions/", "/groups/g/", "/u/someone/activity/"):
        Group.objects.get_or_create(name="G", slug="g")
        User.objects.get_or_create(username="someone")
        response = client.get(url, {"cursor": "garbage"})
        assert response.status_code == 302 and response["Location"] == url
        page = client.get(url).content.decode()
        assert "The cursor is not valid" in page


def test_mentions_page(demo: dict[str, Any]) -> None:
    html = client_for(demo["alice"]).get("/feed/mentions/").content.decode()
    mentioning = set(
        Mention.objects.filter(user=demo["alice"]).values_list("activity_id", flat=True)
    )
    # bob's post mentions alice and she may see it (his close friend); frank's mentions her
    # too, but he shares with his contacts only and alice is not one: hidden.
    visible = {a.pk for a in feed.mentions_timeline(demo["alice"]).activities}
    assert set(activity_ids(html)) == visible
    assert visible and visible <= mentioning
    frank = Activity.objects.get(author__username="frank")
    assert frank.pk in mentioning and frank.pk not in visible


def test_user_activity_page(demo: dict[str, Any]) -> None:
    client = client_for(demo["alice"])
    html = client.get("/u/carol/activity/").content.decode()
    carols = list(
        Activity.objects.filter(author__username="carol")
        .order_by("-created_at")
        .values_list("pk", flat=True)
    )
    assert activity_ids(html) == carols
    assert client.get("/u/nobody-here/activity/").status_code == 404
    assert 'href="/u/carol/activity/"' in client.get("/u/carol/").content.decode()


# --- the post box ---------------------------------------------------------------------------


def test_posting_from_the_feed(make_user: Callable[..., Any]) -> None:
    me, bob = make_user("me"), make_user("bob")
    client = client_for(me)
    page = client.get("/feed/").content.decode()
    assert 'data-mention-endpoint="/presence/api/feed/mention-suggestions"' in page
    assert "demo/mentions.js" in page and finders.find("demo/mentions.js")
    response = client.post("/feed/", {"text": "Hello @bob!"})
    assert response.status_code == 302 and response["Location"] == "/feed/"
    activity = Activity.objects.get()
    assert (activity.author, activity.text) == (me, "Hello @bob!")
    assert list(Mention.objects.values_list("user", flat=True)) == [bob.pk]
    after = client.get("/feed/").content.decode()
    assert "Posted." in after and activity_ids(after) == [activity.pk]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Write something first: the post is empty."),
        ("   ", "Write something first: the post is empty."),
        ("x" * 501, "The post is 501 characters long; at most 500."),
    ],
)
def test_bad_posts_show_the_error_and_keep_the_text(
    text: str, message: str, make_user: Callable[..., Any]
) -> None:
    client = client_for(make_user())
    response = client.post("/feed/", {"text": text})
    assert response.status_code == 200
    html = response.content.decode()
    error = re.search(r'data-testid="post-error">(.*?)</div>', html, re.S)
    assert error and message in error.group(1)
    if text.strip():
        assert text in html  # what was typed is still in the box
    assert not Activity.objects.exists()


# --- groups ---------------------------------------------------------------------------------


def test_groups_list_and_join_leave(demo: dict[str, Any]) -> None:
    carol = demo["carol"]
    client = client_for(carol)
    html = client.get("/groups/").content.decode()
    assert "Book club" in html and "Climbers" in html
    assert 'action="/groups/climbers/join/"' in html and 'action="/groups/book-club/leave/"' in html
    response = client.post("/groups/climbers/join/", {"next": "/groups/"})
    assert response.status_code == 302 and response["Location"] == "/groups/"
    assert Membership.objects.filter(group__slug="climbers", user=carol).exists()
    response = client.post("/groups/climbers/leave/")
    assert response["Location"] == "/groups/climbers/"
    assert not Membership.objects.filter(group__slug="climbers", user=carol).exists()
    assert client.post("/groups/climbers/explode/").status_code == 404
    assert client.post("/groups/nope/join/").status_code == 404
    assert client.get("/groups/climbers/join/").status_code == 405


def test_group_join_and_leave_are_rate_limited(
    demo: dict[str, Any], settings: Any, clock: Any
) -> None:
    settings.PRESENCE = {"HTTP_RATE_LIMIT": (2, 60)}
    carol = demo["carol"]
    client = client_for(carol)
    assert client.post("/groups/climbers/join/").status_code == 302
    assert client.post("/groups/climbers/leave/").status_code == 302
    refused = client.post("/groups/climbers/join/")
    assert refused.status_code == 429 and refused["Retry-After"] == "60"
    assert "try again in 60 seconds" in refused.content.decode()
    assert not Membership.objects.filter(group__slug="climbers", user=carol).exists()
    clock.shift(60)
    assert client.post("/groups/climbers/join/").status_code == 302
    assert Membership.objects.filter(group__slug="climbers", user=carol).exists()


def test_group_page_shows_who_is_online_with_privacy(make_user: Callable[..., Any]) -> None:
    me = make_user("me", first_name="Me")
    friend = make_user("friend", first_name="Friend")
    hidden = make_user("hidden", first_name="Hidden")
    blocker = make_user("blocker", first_name="Blocker")
    offline = make_user("offline", first_name="Offline")
    group = Group.objects.create(name="Runners", slug="runners")
    for user in (me, friend, hidden, blocker, offline):
        Membership.objects.create(group=group, user=user)
        PrivacySettings.objects.create(user=user, online_visibility="everyone")
    PrivacySettings.objects.filter(user=hidden).update(invisible=True)
    Block.objects.create(blocker=blocker, blocked=me)
    for user in (friend, hidden, blocker):
        api.touch(user)
    PrivacySettings.objects.filter(user=friend).update(activity_visibility="everyone")
    post = feed.post(friend, "Run at 7")
    client = client_for(me)  # logging in makes me online too
    html = client.get("/groups/runners/").content.decode()
    online = html[html.index('data-testid="group-online"') :]
    online = online[: online.index("</ul>")]
    names = re.findall(r"</span>([^<]+)</a>", online)
    assert sorted(names) == ["Friend", "Me"]
    assert activity_ids(html) == [post.pk]
    assert "You are a member" in html


def test_nav_links(make_user: Callable[..., Any]) -> None:
    html = client_for(make_user()).get("/feed/").content.decode()
    assert 'href="/feed/" aria-current="page">Feed</a>' in html
    assert 'href="/groups/"' in html


def test_feed_page_costs_do_not_grow_with_the_page(make_user: Callable[..., Any]) -> None:
    me = make_user("me")
    friends = [make_user() for _ in range(5)]
    for friend in friends:
        Contact.objects.create(owner=me, contact=friend)
        PrivacySettings.objects.create(user=friend, activity_visibility="everyone")
    client = client_for(me)

    def cost() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/feed/").status_code == 200
        return len(queries)

    feed.post(friends[0], "one")
    few = cost()
    for n in range(40):
        feed.post(friends[n % 5], f"post {n} @me")
    assert cost() == few


# --- text the database cannot store, or that misleads readers -------------------------------


@pytest.mark.parametrize("path", ["/u/bo%00b/activity/", "/u/bob%E2%80%AE/activity/"])
def test_user_activity_url_with_nul_or_controls_is_400(
    make_user: Callable[..., Any], path: str
) -> None:
    make_user("bob")
    assert client_for(make_user()).get(path).status_code == 400


@pytest.mark.parametrize("text", ["a\x00b", "evil\u202etxt.exe"])
def test_post_box_refuses_nul_and_controls(make_user: Callable[..., Any], text: str) -> None:
    response = client_for(make_user()).post("/feed/", {"text": text})
    assert response.status_code == 200
    assert re.search(r'data-testid="post-error">', response.content.decode())
    assert not Activity.objects.exists()
