"""presence wired into a forum shaped as Spirit (categories, topics, private topics with their
participants, a user list, avatars) from the README and the book alone (issue 38): topic rooms
behind the forum's own rule, member cards with avatars, the ready privacy page in the forum's
layout, the live online count and guests, the comments' authors' dots prefetched. Runs on
tests.settings.forum only (`make test`'s forum_site run; tests/sites/conftest.py leaves it out of
the other runs). Its sockets: test_forumsite_sockets.py; in Chromium: test_forumsite_browser.py.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from presence import api
from presence.models import PrivacySettings
from tests.privacy_cases import count_round_trips
from tests.privacy_page_cases import page as settings_page
from tests.rooms.members import enter
from tests.sites.forumsite import people
from tests.sites.forumsite.models import Comment, Topic
from tests.stamping import without_stamps

pytestmark = [pytest.mark.django_db, pytest.mark.forum_site]

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SETTINGS = (ROOT / "tests" / "settings" / "forum.py").read_text()
COUNT = (
    '<span class="presence-online-count" data-presence-online-count="/presence/api/online_count">'
    "{members}</span> members and {guests} guests online"
)


def dot(user: Any, status: str) -> str:
    label = status.title()
    return (
        f'<span class="presence-dot presence-dot--{status}" data-presence-user="{user.pk}" '
        f'title="{label}" aria-label="{label}" role="img"></span>'
    )


def listed(user: Any, status: str, card: str, last_seen: str) -> str:
    """One person of the user list: avatar (or initials), dot, name, last seen."""
    return (
        f'<li class="user" data-user="{user.pk}">{card}{dot(user, status)} '
        f"<b>{user.get_full_name() or user.username}</b> "
        f'<span data-presence-last-seen="{user.pk}">{last_seen}</span></li>'
    )


def avatar(user: Any) -> str:
    return f'<img class="avatar" src="/media/avatars/{user.username}.png" alt="">'


def signed_in(user: Any, **extra: Any) -> Client:
    client = Client(**extra)
    client.force_login(user)
    return client


@pytest.fixture(autouse=True)
def _media(settings: Any, tmp_path: Path) -> None:
    settings.MEDIA_ROOT = str(tmp_path / "media")


@pytest.fixture
def forum(_media: None, clock: time_machine.Coordinates) -> Iterator[dict[str, Any]]:
    yield people.forum()


# --- the site is wired from the book ----------------------------------------------------------


def test_the_settings_and_asgi_are_the_readmes_as_printed() -> None:
    wiring = re.search(r"```python\n# settings\.py\n(.*?)\n# urls\.py", README, re.S)
    assert wiring is not None
    pasted = wiring.group(1).replace('"redis://127.0.0.1:6379/0"', "REDIS_URL")
    # The CACHES and the channel layer as printed, PRESENCE grown from the printed one.
    caches, layers = pasted.split("\n\n")[-1].split('PRESENCE = {"CACHE_ALIAS": "presence"}\n')
    assert caches in SETTINGS and layers in SETTINGS
    assert 'PRESENCE = {\n    "CACHE_ALIAS": "presence",\n' in SETTINGS
    assert 'ASGI_APPLICATION = "tests.sites.forumsite.asgi.application"' in SETTINGS
    for line in pasted.splitlines():
        if "presence" in line and "#" in line and "feed" not in line:
            assert line.strip() in SETTINGS
    asgi = re.search(r"```python\n(# asgi\.py.*?)```", README, re.S)
    assert asgi is not None
    ours = (ROOT / "tests" / "sites" / "forumsite" / "asgi.py").read_text()
    assert asgi.group(1).replace('"mysite.settings"', '"tests.settings.forum"') in ours


def test_checks_pass() -> None:
    out = io.StringIO()
    call_command("check", stdout=out)  # raises SystemCheckError on any error
    assert "no issues" in out.getvalue()


# --- a topic page: the comments' authors' dots, the topic's room --------------------------------


def topic_page_cost(topic: Topic, viewer: Client) -> tuple[int, int, str]:
    """(queries, Redis round trips, html) of one view of the topic's page."""
    url = reverse("topic", args=[topic.pk])
    viewer.get(url)  # the viewer's own page view is recorded once (TOUCH_INTERVAL) first
    with count_round_trips() as trips, CaptureQueriesContext(connection) as queries:
        response = viewer.get(url)
    assert response.status_code == 200
    return len(queries), trips.count, without_stamps(response.content.decode())


def test_a_topic_page_costs_the_same_for_3_and_30_commenters(forum: dict[str, Any]) -> None:
    ann, cy = forum["ann"], forum["cy"]
    few = Topic.objects.create(category=forum["general"], user=ann, title="few")
    many = Topic.objects.create(category=forum["general"], user=ann, title="many")
    authors = [people.member(f"author{i}", f"Author {i}", avatar=i % 2 == 0) for i in range(30)]
    for i, author in enumerate(authors):
        if i < 3:
            Comment.objects.create(topic=few, user=author, text=f"few {i}")
        Comment.objects.create(topic=many, user=author, text=f"many {i}")
    api.touch(authors[0])  # online: everyone sees it (the forum's DEFAULT_PRIVACY)
    viewer = signed_in(cy)
    few_queries, few_trips, _ = topic_page_cost(few, viewer)
    many_queries, many_trips, html = topic_page_cost(many, viewer)
    assert (many_queries, many_trips) == (few_queries, few_trips)
    assert (many_queries, many_trips) <= (10, 8), (many_queries, many_trips)
    # Each author's dot as the viewer may see it, avatar and card name beside it.
    assert f"{avatar(authors[0])}{dot(authors[0], 'online')} <b>Author 0</b>" in html
    assert f"<header>{dot(authors[1], 'offline')} <b>Author 1</b></header>" in html
    assert html.count('class="presence-dot presence-dot--') == 30  # the room: nobody in it yet


def test_the_topics_room_lists_who_is_reading_it_with_their_cards(forum: dict[str, Any]) -> None:
    ann, ben, cy = forum["ann"], forum["ben"], forum["cy"]
    public = forum["public"]
    enter(ann, f"topic:{public.pk}")
    html = without_stamps(signed_in(cy).get(reverse("topic", args=[public.pk])).content.decode())
    assert f'data-presence-room="topic:{public.pk}"' in html
    assert (
        f'<li class="presence-room__member" data-presence-room-member="{ann.pk}">'
        f'<img class="presence-room__avatar" src="/media/avatars/ann.png" alt="Ann Smith">'
        f'{dot(ann, "online")} <span class="presence-room__name">Ann Smith</span></li>'
    ) in html
    assert "Here now: <span data-presence-room-count>1</span>" in html
    assert f'data-presence-room-member="{ben.pk}"' not in html


def test_the_topic_list_shows_how_many_are_in_each_topic_in_one_round_trip(
    forum: dict[str, Any],
) -> None:
    ann, ben, cy = forum["ann"], forum["ben"], forum["cy"]
    public, general = forum["public"], forum["general"]
    quiet = Topic.objects.create(category=general, user=ben, title="Quiet")
    enter(ann, f"topic:{public.pk}")
    enter(ben, f"topic:{public.pk}")
    viewer = signed_in(cy)
    url = reverse("category", args=[general.slug])
    viewer.get(url)  # the viewer's own page view is recorded once (TOUCH_INTERVAL) first
    with count_round_trips() as trips:
        html = without_stamps(viewer.get(url).content.decode())
    # The topics' rooms counted in one round trip, a script each (the private topic is not
    # listed); beside them the dots' read and the page's online count.
    assert [trip for trip in trips.commands if "EVALSHA" in trip] == [["EVALSHA"] * 2]
    assert trips.count == 3, trips.commands
    count = (
        '<span class="presence-room-count" data-presence-room-count-of="topic:{}"'
        ' data-presence-room-counts-endpoint="/presence/api/room_counts"'
        ' data-presence-room-counts-limit="100">{}</span> here'
    )
    assert f"Welcome</a> by {dot(ann, 'online')} ann · {count.format(public.pk, 2)}</li>" in html
    assert f"Quiet</a> by {dot(ben, 'online')} ben · {count.format(quiet.pk, 0)}</li>" in html
    # An anonymous visitor is shown no count.
    assert "presence-room-count" not in Client().get(url).content.decode()


# --- private topics: their participants only --------------------------------------------------


def test_a_private_topic_and_its_room_are_for_its_participants_only(
    forum: dict[str, Any],
) -> None:
    ann, ben, cy = forum["ann"], forum["ben"], forum["cy"]
    private = forum["private"]
    room_url = reverse("presence:room", args=[f"topic:{private.pk}"])
    page_url = reverse("topic", args=[private.pk])
    enter(ann, f"topic:{private.pk}")
    stranger = signed_in(cy)
    assert stranger.get(page_url).status_code == 403
    refused = stranger.get(room_url)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert Client().get(page_url).status_code == 403  # nor anonymous visitors
    assert Client().get(room_url).status_code == 401

    participant = signed_in(ben)
    html = without_stamps(participant.get(page_url).content.decode())
    assert f'data-presence-room="topic:{private.pk}"' in html
    assert f'data-presence-room-member="{ann.pk}"' in html
    room = participant.get(room_url).json()
    assert room["count"] == 1 and room["others"] == 0
    assert room["members"][str(ann.pk)]["card"] == {
        "name": "Ann Smith",
        "avatar": "/media/avatars/ann.png",
    }
    assert room["members"][str(ann.pk)]["presence"]["status"] == "online"
    # The public topic's room admits any member; an id of no topic, nobody.
    public_room = reverse("presence:room", args=[f"topic:{forum['public'].pk}"])
    assert stranger.get(public_room).status_code == 200
    assert stranger.get(reverse("presence:room", args=["topic:999999"])).status_code == 403
    assert stranger.get(reverse("presence:room", args=["topic:abc"])).status_code == 403


# --- the user list, and the privacy page ------------------------------------------------------


def test_the_user_list_shows_dots_and_cards(forum: dict[str, Any]) -> None:
    ann, ben, cy, dee = forum["ann"], forum["ben"], forum["cy"], forum["dee"]
    api.touch(ann)
    html = without_stamps(signed_in(cy).get(reverse("users")).content.decode())
    assert listed(ann, "online", avatar(ann), "online") in html
    assert listed(ben, "offline", avatar(ben), "") in html
    assert listed(cy, "online", avatar(cy), "online") in html  # the viewer's own page view
    assert listed(dee, "offline", '<span class="avatar">DE</span>', "") in html  # no avatar
    anonymous = without_stamps(Client().get(reverse("users")).content.decode())
    assert listed(ann, "online", avatar(ann), "online") in anonymous  # a public forum
    assert "presence.js" not in anonymous


def test_the_privacy_page_saves_a_level_and_the_user_list_follows_it(
    forum: dict[str, Any], clock: time_machine.Coordinates
) -> None:
    ann, cy = forum["ann"], forum["cy"]
    ann_client, stranger = signed_in(ann), signed_in(cy)
    ann_client.get(reverse("index"))
    before = without_stamps(stranger.get(reverse("users")).content.decode())
    assert listed(ann, "online", avatar(ann), "online") in before

    # The forum links to presence's page, which shows in the forum's own layout.
    assert f'href="{reverse("presence:settings")}"' in before
    html = without_stamps(ann_client.get(reverse("presence:settings")).content.decode())
    assert "<title>Privacy and status</title>" in html
    assert '<a href="/users/">Users</a>' in html and "who-is-online" in html
    values = settings_page(ann_client)
    values.update({"online_visibility": "contacts", "last_seen_visibility": "nobody"})
    response = ann_client.post(reverse("presence:settings"), values)
    assert response.status_code == 302
    assert "Your settings are saved." in without_stamps(
        ann_client.get(response.url).content.decode()
    )
    row = PrivacySettings.objects.get(user=ann)
    assert (row.online_visibility, row.last_seen_visibility) == ("contacts", "nobody")

    after = without_stamps(stranger.get(reverse("users")).content.decode())
    assert listed(ann, "offline", avatar(ann), "") in after
    # Anonymous visitors of the page are sent to the forum's login page.
    anonymous = Client().get(reverse("presence:settings"))
    assert anonymous.status_code == 302
    assert anonymous.url == f"/accounts/login/?next={reverse('presence:settings')}"


# --- the live count, and guests ---------------------------------------------------------------


def test_members_and_guests_online(
    forum: dict[str, Any],
    clock: time_machine.Coordinates,
    django_capture_on_commit_callbacks: Any,
) -> None:
    ann, ben = forum["ann"], forum["ben"]
    # Three guests (one of them twice), told apart by their addresses: none has a session.
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.1"):
        assert Client(REMOTE_ADDR=address).get(reverse("index")).status_code == 200
    signed_in(ann).get(reverse("index"))
    member_client = signed_in(ben)
    # A count is read once per 5 s per process (the guests' one was read by the first page).
    clock.shift(5)
    html = without_stamps(member_client.get(reverse("index")).content.decode())
    assert COUNT.format(members=2, guests=3) in html
    assert api.online_count() == 2 and api.guest_count() == 3
    guest = Client(REMOTE_ADDR="10.0.0.1")  # a guest already counted
    answer = guest.get(reverse("presence:online_count"))
    assert answer.json() == {"count": 2}
    assert answer["Cache-Control"] == "public, max-age=5"
    # Going invisible leaves a member out of the count (once committed: the test's transaction
    # stands for a request's).
    with django_capture_on_commit_callbacks(execute=True):
        api.set_status(ben, "invisible")
    clock.shift(5)
    assert COUNT.format(members=1, guests=3) in without_stamps(
        guest.get(reverse("index")).content.decode()
    )
    assert guest.get(reverse("presence:online_count")).json() == {"count": 1}
