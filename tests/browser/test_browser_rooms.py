"""Rooms in a real browser (issue 25): the demo's post and group pages show who is there now,
and two browsers see each other arrive and leave without a reload ({% room_presence %} and
presence.js against daphne).

The browser, the servers and the people: tests/browser/pages.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from presence.feed import api as feed
from presence.feed.models import Group
from tests.browser.pages import GRACE, LIVE, MARGIN, ONLINE, Browser, expect
from tests.browser.pages import browser as browser
from tests.browser.pages import chromium as chromium
from tests.browser.pages import people as people
from tests.daphne import Daphne, daphne_fixture  # noqa: F401 (the daphne fixture)

pytestmark = pytest.mark.django_db(transaction=True)

#: the demo's rules (siteproject/settings.py), on the live servers' small timings
ROOMS = {
    "post": "siteproject.demo.rooms.can_read_post",
    "group": "siteproject.demo.rooms.is_group_member",
}


@pytest.fixture
def rooms_live(daphne: Callable[..., Daphne], people: dict[str, Any]) -> Daphne:
    return daphne({**LIVE, "ROOMS": ROOMS})


def room(session: Any, name: str) -> Any:
    return session.page.locator(f'[data-presence-room="{name}"]')


def member(session: Any, name: str, user: Any) -> Any:
    return room(session, name).locator(f'[data-presence-room-member="{user.pk}"]')


def test_two_readers_of_a_post_see_each_other_arrive_and_leave(
    browser: Browser, rooms_live: Daphne, people: dict[str, Any]
) -> None:
    ann, ben, cy = people["ann"], people["ben"], people["cy"]
    post = feed.post(ann, "Rooms are here")  # ann's activity: her contacts (ben) may read it
    name = f"post:{post.pk}"
    a = browser.open(ann, rooms_live.url)
    a.page.goto(a.url("demo:post", post.pk))
    a.wait_connected()
    expect(member(a, name, ann)).to_be_visible()  # her own join, from room_state
    expect(room(a, name).locator("[data-presence-room-count]")).to_have_text("1")
    a.page.evaluate("() => { window.loadedOnce = true; }")  # gone if the page reloads

    b = browser.open(ben, rooms_live.url)
    b.page.goto(b.url("demo:post", post.pk))
    # ben arrives on ann's page, live: avatar, online dot and name; the count follows.
    expect(member(a, name, ben)).to_be_visible()
    expect(member(a, name, ben).locator(".presence-room__name")).to_have_text("ben")
    expect(member(a, name, ben).locator(".presence-dot")).to_have_class(ONLINE)
    expect(room(a, name).locator("[data-presence-room-count]")).to_have_text("2")
    # ben's page lists both of them: ann rendered by the server or by his room_state.
    expect(member(b, name, ann)).to_be_visible()
    expect(member(b, name, ben)).to_be_visible()
    joins = [f for f in b.frames_sent if f["type"] == "join"]
    assert joins == [{"type": "join", "room": name, "meta": None}]

    left = time.monotonic()
    b.page.close()  # pagehide: presence.js sends leave before the socket closes
    expect(member(a, name, ben)).to_have_count(0, timeout=(GRACE + 1 + MARGIN) * 1000)
    elapsed = time.monotonic() - left
    assert elapsed >= GRACE, f"left the room after {elapsed:.2f} s, before the grace"
    expect(room(a, name).locator("[data-presence-room-count]")).to_have_text("1")
    assert a.page.evaluate("() => window.loadedOnce") is True

    # cy may not read ann's post (contacts only): a 404, no room on the page, no join.
    c = browser.open(cy, rooms_live.url)
    c.allowed.append(r"status of 404 \(Not Found\)")  # the page's own answer, expected
    response = c.page.goto(c.url("demo:post", post.pk))
    assert response is not None and response.status == 404
    assert not [f for f in c.frames_sent if f["type"] == "join"]


def test_group_members_see_who_is_in_the_group_now(
    browser: Browser, rooms_live: Daphne, people: dict[str, Any]
) -> None:
    ann, ben, cy = people["ann"], people["ben"], people["cy"]
    group = Group.objects.create(name="Climbers", slug="climbers")
    feed.join(ann, group)
    feed.join(ben, group)
    name = "group:climbers"
    a = browser.open(ann, rooms_live.url)
    a.page.goto(a.url("demo:group", "climbers"))
    a.wait_connected()
    expect(member(a, name, ann)).to_be_visible()
    a.page.evaluate("() => { window.loadedOnce = true; }")

    b = browser.open(ben, rooms_live.url)
    b.page.goto(b.url("demo:group", "climbers"))
    expect(member(a, name, ben)).to_be_visible()
    expect(room(a, name).locator("[data-presence-room-count]")).to_have_text("2")

    # cy is no member: his page of the group has no room, and ann's count does not move.
    c = browser.open(cy, rooms_live.url)
    c.page.goto(c.url("demo:group", "climbers"))
    c.wait_connected()
    expect(room(c, name)).to_have_count(0)
    assert not [f for f in c.frames_sent if f["type"] == "join"]

    b.page.goto(b.url("demo:home"))  # ben navigates away: he leaves the group's room
    expect(member(a, name, ben)).to_have_count(0, timeout=(GRACE + 1 + MARGIN) * 1000)
    expect(room(a, name).locator("[data-presence-room-count]")).to_have_text("1")
    assert a.page.evaluate("() => window.loadedOnce") is True


def test_member_cards_show_their_avatars_live(
    browser: Browser, daphne: Callable[..., Daphne], people: dict[str, Any]
) -> None:
    """PRESENCE["MEMBER_CARD"] (issue 38): a member who arrives after the page was rendered is
    shown by their card, from the room_diff: the avatar image with the name as its text
    alternative, and the card's name. Without an avatar, the initials (the other tests)."""
    server = daphne({**LIVE, "ROOMS": ROOMS, "MEMBER_CARD": "tests.rooms.cards.with_avatar"})
    ann, ben = people["ann"], people["ben"]
    post = feed.post(ann, "Cards are here")
    name = f"post:{post.pk}"
    a = browser.open(ann, server.url)
    # The cards' images (/media/...) are not served by the test server: their 404s are expected.
    a.allowed.append(r"status of 404 \(Not Found\)")
    a.page.goto(a.url("demo:post", post.pk))
    a.wait_connected()
    own = member(a, name, ann)
    expect(own.locator("img.presence-room__avatar")).to_have_attribute("src", "/media/ann.png")

    b = browser.open(ben, server.url)
    b.allowed.append(r"status of 404 \(Not Found\)")
    b.page.goto(b.url("demo:post", post.pk))
    arrived = member(a, name, ben)
    expect(arrived.locator(".presence-room__name")).to_have_text("Ben Card")
    avatar = arrived.locator("img.presence-room__avatar")
    expect(avatar).to_have_attribute("src", "/media/ben.png")
    expect(avatar).to_have_attribute("alt", "Ben Card")
    expect(arrived.locator("span.presence-room__avatar")).to_have_count(0)
    # ben's page: ann rendered by the server with her card.
    expect(member(b, name, ann).locator("img.presence-room__avatar")).to_have_attribute(
        "alt", "Ann Card"
    )
