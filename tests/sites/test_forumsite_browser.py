"""The forum in Chromium (tests.settings.forum, `make test`'s forum_site run): real daphne
processes serve the forum's own ASGI application (tests/sites/forumsite/asgi.py) on the test
database; two participants of a private topic see each other arrive in its room live, with their
avatars, and the footer's "N members and M guests online" goes up without a reload.

The browser: tests/browser/pages.py (headless /usr/bin/chromium through Playwright; skipped
where it is missing). Every wait is for a DOM condition, bounded, never a fixed pause."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.urls import reverse

from tests.browser.pages import LIVE, MARGIN, ONLINE, Browser, Session, expect
from tests.browser.pages import chromium as chromium
from tests.daphne import Daphne
from tests.sites.forumsite import people

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.forum_site]


class ForumDaphne(Daphne):
    APPLICATION = "tests.sites.forumsite.asgi:application"
    SETTINGS_MODULE = "tests.settings.forum_daphne"
    READY_PATH = "/accounts/login/"

    def environment(self) -> dict[str, str]:
        return {"FORUM_MEDIA_ROOT": str(django_settings.MEDIA_ROOT)}


@pytest.fixture
def forum(settings: Any, tmp_path: Path, transactional_db: Any) -> dict[str, Any]:
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return people.forum()


@pytest.fixture
def forum_server(forum: dict[str, Any]) -> Iterator[Daphne]:
    """The forum served by daphne (after its rows exist: the server reads them)."""
    server = ForumDaphne(LIVE)
    try:
        yield server.start()
    finally:
        server.stop()
        server.log.close()


@pytest.fixture
def browser(chromium: str, forum_server: Daphne) -> Iterator[Browser]:
    """Closed before the server stops; no page may have logged an error or thrown."""
    b = Browser(chromium)
    yield b
    errors = b.close()
    assert not errors, f"browser errors: {errors}"


def on_the_page(browser: Browser, user: Any, server: Daphne, path: str) -> Session:
    """``user`` signs in through the forum's login page, which leads on to ``path``."""
    session = browser.open(user, server.url, log_in=False)
    session.page.goto(f"{server.url}{reverse('login')}?next={path}")
    session.page.get_by_label("Username").fill(user.username)
    session.page.get_by_label("Password").fill("pw")  # people.member's password
    session.page.get_by_role("button", name="Log in").click()
    session.page.wait_for_url(server.url + path)
    session.wait_connected()
    return session


def member(session: Session, room: str, user: Any) -> Any:
    return session.page.locator(
        f'[data-presence-room="{room}"] [data-presence-room-member="{user.pk}"]'
    )


def test_participants_see_each_other_arrive_with_avatars_and_the_count_goes_up(
    browser: Browser, forum_server: Daphne, forum: dict[str, Any]
) -> None:
    ann, ben = forum["ann"], forum["ben"]
    private = forum["private"]
    room, path = f"topic:{private.pk}", reverse("topic", args=[private.pk])
    a = on_the_page(browser, ann, forum_server, path)
    expect(member(a, room, ann).locator("img.presence-room__avatar")).to_have_attribute(
        "src", "/media/avatars/ann.png"
    )
    count = a.page.locator("footer [data-presence-online-count]")
    expect(count).to_have_text("1")
    a.page.evaluate("() => { window.loadedOnce = true; }")  # gone if the page reloads

    b = on_the_page(browser, ben, forum_server, path)
    # ben arrives on ann's page, live: his avatar (a real image), dot and name.
    arrived = member(a, room, ben)
    expect(arrived.locator(".presence-room__name")).to_have_text("Ben Ito")
    avatar = arrived.locator("img.presence-room__avatar")
    expect(avatar).to_have_attribute("src", "/media/avatars/ben.png")
    expect(avatar).to_have_attribute("alt", "Ben Ito")
    expect(arrived.locator(".presence-dot")).to_have_class(ONLINE)
    a.page.wait_for_function(
        "(img) => img.complete && img.naturalWidth === 1", arg=avatar.element_handle()
    )
    expect(
        a.page.locator(f'[data-presence-room="{room}"] [data-presence-room-count]')
    ).to_have_text("2")
    # The footer's count, pushed within the 5 s the server waits between two updates.
    expect(count).to_have_text("2", timeout=(5 + MARGIN) * 1000)
    # Guests (rendered with the page, not live): the server's readiness probe, and the login
    # pages of both browsers (one address and user agent, no session yet: one visitor). The
    # page renders the process's reading of the last 5 s, which may precede the login pages.
    footer = a.page.locator("footer .who-is-online").inner_text()
    assert footer in {"2 members and 1 guests online", "2 members and 2 guests online"}, footer
    # ben's page: ann rendered by the server, with her avatar.
    expect(member(b, room, ann).locator("img.presence-room__avatar")).to_have_attribute(
        "alt", "Ann Smith"
    )
    assert a.page.evaluate("() => window.loadedOnce") is True
    assert [f for f in a.frames_sent if f["type"] == "join"] == [
        {"type": "join", "room": room, "meta": None}
    ]
    assert a.http_requests == []  # pushed over the socket, never polled


def test_the_topic_lists_counts_go_up_and_down_live_without_joining_the_topics(
    browser: Browser, forum_server: Daphne, forum: dict[str, Any]
) -> None:
    """{% room_count %} on an index page: presence.js watches each topic's count
    (watch_room_count), so the reader of the list is in no topic's room (not "here now" in
    each, no room_entered, no MAX_ROOMS place) and sees the counts change live."""
    ann, cy = forum["ann"], forum["cy"]
    public, general = forum["public"], forum["general"]
    room = f"topic:{public.pk}"
    reader = on_the_page(browser, cy, forum_server, reverse("category", args=[general.slug]))
    count = reader.page.locator(f'[data-presence-room-count-of="{room}"]')
    expect(count).to_have_text("0")
    a = on_the_page(browser, ann, forum_server, reverse("topic", args=[public.pk]))
    expect(member(a, room, ann)).to_be_visible()
    expect(count).to_have_text("1", timeout=(1 + MARGIN) * 1000)
    # The reader joined no topic: ann's page lists her alone, and counts her alone.
    expect(
        a.page.locator(f'[data-presence-room="{room}"] [data-presence-room-count]')
    ).to_have_text("1")
    a.page.close()  # pagehide: ann leaves the topic; gone for everyone after the grace
    expect(count).to_have_text("0", timeout=(LIVE["OFFLINE_GRACE"] + 1 + MARGIN) * 1000)
    sent = reader.frames_sent
    assert {"type": "watch_room_count", "room": room} in sent
    assert not [f for f in sent if f["type"] == "join"]
    assert reader.http_requests == []  # pushed over the socket, never polled
