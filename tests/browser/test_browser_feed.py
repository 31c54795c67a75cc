"""The demo's post box in a real browser: mention completion (demo/mentions.js) and posting.

Uses the browser of tests/browser/ (headless Debian Chromium via Playwright; skipped
without /usr/bin/chromium) against pytest-django's ``live_server``, without WebSockets.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest
from django.db import connection

from presence.feed import api as feed
from presence.feed.models import Activity, Mention
from presence.models import Contact, PrivacySettings
from tests.browser.pages import Browser, browser, chromium, expect, live, people  # noqa: F401
from tests.daphne import daphne_fixture  # noqa: F401 (the browser fixture's daphne)

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")


def in_thread(query: Callable[[], T]) -> T:
    """Read the database once the browser runs: Playwright's loop runs in this thread, where
    Django refuses database calls, so another thread asks (rows are committed)."""

    def run() -> T:
        try:
            return query()
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def test_mention_completion_and_posting(
    browser: Browser,  # noqa: F811
    live_server: Any,
    people: dict[str, Any],  # noqa: F811
) -> None:
    ann, ben = people["ann"], people["ben"]
    PrivacySettings.objects.create(user=ann, activity_visibility="everyone")
    a = browser.open(ann, live_server.url, websocket=False)
    a.page.goto(a.url("demo:feed"))
    box = a.page.get_by_label("What's new?")
    options = a.page.locator("#mention-list [role=option]")

    # An e-mail address is no mention: no list.
    box.press_sequentially("mail x@be")
    a.page.wait_for_timeout(400)  # longer than the typing pause the list waits for
    expect(a.page.locator("#mention-list")).to_be_hidden()
    box.fill("")

    box.press_sequentially("Coffee, @B")
    expect(options).to_have_text(["@ben"])
    expect(box).to_have_attribute("aria-expanded", "true")
    box.press("Enter")  # picks the highlighted name instead of a new line
    expect(box).to_have_value("Coffee, @ben ")
    expect(a.page.locator("#mention-list")).to_be_hidden()
    box.press_sequentially("and @c")
    expect(options).to_have_text(["@cy"])
    box.press("Escape")
    expect(a.page.locator("#mention-list")).to_be_hidden()
    box.press_sequentially("y?")

    a.page.get_by_role("button", name="Post").click()
    a.page.wait_for_url(a.url("demo:feed"))
    expect(a.page.get_by_text("Posted.")).to_be_visible()
    link = a.page.locator(".activity__text a.mention").first
    expect(link).to_have_text("@ben")
    expect(link).to_have_attribute("href", f"/u/{ben.username}/")
    assert in_thread(lambda: Activity.objects.get().text) == "Coffee, @ben and @cy?"
    mentioned = in_thread(lambda: set(Mention.objects.values_list("user__username", flat=True)))
    assert mentioned == {"ben", "cy"}


def test_an_empty_post_shows_the_error(
    browser: Browser,  # noqa: F811
    live_server: Any,
    people: dict[str, Any],  # noqa: F811
) -> None:
    a = browser.open(people["ann"], live_server.url, websocket=False)
    a.page.goto(a.url("demo:feed"))
    a.page.get_by_label("What's new?").fill("   ")
    a.page.get_by_role("button", name="Post").click()
    expect(a.page.get_by_role("alert")).to_contain_text("Write something first")
    assert not in_thread(Activity.objects.exists)


def test_a_followed_users_post_appears_live_on_the_feed(
    browser: Browser,  # noqa: F811
    live: Any,  # noqa: F811
    people: dict[str, Any],  # noqa: F811
) -> None:
    """Through the page's presence WebSocket (watch_feed), no reload: ann follows ben and is
    among ben's contacts (the default activity_visibility); cy is neither and sees nothing."""
    ann, ben, cy = people["ann"], people["ben"], people["cy"]
    Contact.objects.create(owner=cy, contact=ben)  # cy follows ben; ben does not know cy
    a = browser.open(ann, live.url)
    c = browser.open(cy, live.url)
    for page in (a, c):
        page.page.goto(page.url("demo:feed"))
        page.wait_connected()
        page.page.evaluate("() => { window.loadedOnce = true; }")
    expect(a.page.locator("[data-live-feed=following]")).to_be_attached()
    a.page.wait_for_function("() => window.presence.state === 'open'")

    in_thread(lambda: feed.post(ben, "Climbing tonight, @ann?"))

    item = a.page.locator(".activity--live").first
    expect(item).to_contain_text("Climbing tonight")
    expect(item.locator(".mention")).to_have_text("@ann")  # a stored mention, marked up
    assert a.page.evaluate("() => window.loadedOnce") is True
    c.page.wait_for_timeout(500)
    expect(c.page.locator(".activity--live")).to_have_count(0)


def test_a_post_made_before_the_pages_watch_is_answered_still_shows(
    browser: Browser,  # noqa: F811
    live: Any,  # noqa: F811
    people: dict[str, Any],  # noqa: F811
) -> None:
    """The page watches its timeline from the newest activity it was rendered with (watch_feed
    "after"): a post made after the page was rendered and before its watch was answered (here,
    while its scripts load) is sent with the answer, in its place above the rendered one."""
    ann, ben = people["ann"], people["ben"]
    PrivacySettings.objects.create(user=ben, activity_visibility="everyone")
    first = feed.post(ben, "Rendered with the page")
    a = browser.open(ann, live.url)

    def post_while_loading(route: Any) -> None:
        in_thread(lambda: feed.post(ben, "Posted while the page loaded"))
        route.continue_()

    a.page.route("**/presence/presence.js*", post_while_loading)
    a.page.goto(a.url("demo:user_feed", ben.username))
    a.wait_connected()
    items = a.page.locator("[data-live-feed] .activity")
    expect(items).to_have_count(2)
    expect(items.first).to_contain_text("Posted while the page loaded")
    expect(items.nth(1)).to_have_attribute("data-activity", str(first.pk))


def test_a_feed_named_by_a_number_is_never_taken_for_a_status_answer(
    browser: Browser,  # noqa: F811
    live: Any,  # noqa: F811
    people: dict[str, Any],  # noqa: F811
) -> None:
    """watchFeed(5), a name of no timeline, then setStatus: the server's refusal of the feed
    names it (it names only a feed sent as a string), so the status change is not rejected
    with the feed's error; it is saved, and the page is told which feed was refused."""
    ben = people["ben"]
    b = browser.open(ben, live.url)
    b.wait_connected()
    result = b.page.evaluate(
        """async () => {
            const errors = [];
            window.presence.on("error", (e) => errors.push(e));
            window.presence.watchFeed(5);
            try {
                const own = await window.presence.setStatus({status: "dnd", text: "Saved"});
                return {saved: [own.status, own.text], errors};
            } catch (e) {
                return {refused: e.code, errors};
            }
        }"""
    )
    assert result.get("saved") == ["dnd", "Saved"], result
    assert [(e["code"], e.get("feed")) for e in result["errors"]] == [("invalid_value", "5")]
    assert {"type": "watch_feed", "feed": "5"} in b.frames_sent
