"""The header's status menu ({% presence_status_menu %}) in Chromium, on the demo under its strict
Content Security Policy (a violation is a console error, which fails the test): saved through
presence.js over the socket with a clearing time, seen live on a friend's page; saved again, it
keeps that time; without JavaScript, a plain form that saves and comes back to the page.

The menu's markup and its POST: tests/core/test_status_menu.py; its refusals and the polling
fallback: tests/browser/test_browser_live.py, tests/browser/test_browser_polling.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from tests.browser.pages import DND, MARGIN, ONLINE, Browser, expect
from tests.browser.pages import browser as browser
from tests.browser.pages import chromium as chromium
from tests.browser.pages import live as live
from tests.browser.pages import people as people
from tests.daphne import Daphne, daphne_fixture  # noqa: F401 (the daphne fixture)

FOUR_HOURS = 4 * 3600


def keep_option(menu: Any) -> Any:
    return menu.locator('select[name="expires"] option[value="keep"]')


def clears_at(option: Any) -> datetime:
    return datetime.fromisoformat(option.get_attribute("data-presence-expires-at"))


def test_the_menu_sets_a_status_that_clears_and_a_friend_sees_it_live(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    ann, ben = people["ann"], people["ben"]
    a = browser.open(ann, live.url)
    b = browser.open(ben, live.url)
    expect(a.dot(ben)).to_have_class(ONLINE)
    b.wait_connected()

    before = datetime.now(UTC).replace(microsecond=0)
    b.set_status("Do not disturb", text="Focus", emoji="🎧", expires="in 4 hours")
    expect(a.dot(ben)).to_have_class(DND)  # live on ann's page
    expect(b.status_menu).not_to_have_attribute("open", "")  # closed once saved
    expect(b.page.locator("[data-presence-status-summary]")).to_have_text("🎧 Focus")
    after = datetime.now(UTC)
    sent = [f for f in b.frames_sent if f["type"] == "set_status"]
    assert sent == [
        {
            "type": "set_status",
            "status": "dnd",
            "text": "Focus",
            "emoji": "🎧",
            "activity": None,
            "expires_in": FOUR_HOURS,
        }
    ]
    assert b.http_requests == []  # over the socket
    seen = a.refresh()[str(ben.pk)]
    assert (seen["status"], seen["text"], seen["emoji"]) == ("dnd", "Focus", "🎧")

    # The menu now offers the time it set, chosen, as the server does on the next page.
    keep = keep_option(b.status_menu)
    expect(keep).to_have_count(1)
    assert b.status_menu.locator('select[name="expires"]').input_value() == "keep"
    set_in_page = clears_at(keep)
    assert before + timedelta(seconds=FOUR_HOURS - 2) <= set_in_page
    assert set_in_page <= after + timedelta(seconds=FOUR_HOURS + 2)
    b.page.reload()
    keep = keep_option(b.status_menu)
    assert b.status_menu.locator('select[name="expires"]').input_value() == "keep"
    stored = clears_at(keep)
    assert before + timedelta(seconds=FOUR_HOURS) <= stored <= after + timedelta(seconds=FOUR_HOURS)
    assert abs((stored - set_in_page).total_seconds()) <= 2

    # Saved again with only the mode changed: the text still clears then, not 4 hours later.
    b.wait_connected()
    b.page.wait_for_timeout(2000)  # so that "4 hours from now" would be a later time
    b.set_status("Automatic — online while you are active", text="Focus", emoji="🎧")
    expect(a.dot(ben)).to_have_class(ONLINE)
    resent = [f for f in b.frames_sent if f["type"] == "set_status"][-1]
    assert resent["status"] == "auto" and resent["text"] == "Focus"
    left = (stored - datetime.now(UTC)).total_seconds()
    assert resent["expires_in"] < FOUR_HOURS  # what is left, not 4 hours from this save
    assert abs(resent["expires_in"] - left) <= 2


def test_without_javascript_the_menu_posts_and_comes_back(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    ann, ben = people["ann"], people["ben"]
    b = browser.open(ben, live.url, javascript=False)
    a = browser.open(ann, live.url)
    a.wait_connected()
    expect(a.dot(ben)).not_to_have_class(DND)
    people_page = b.url("demo:people") + "?q=an"
    b.page.goto(people_page)
    b.status_menu.locator("summary").click()  # <details> opens without a script
    b.status_menu.get_by_role("radio", name="Do not disturb").check()
    b.status_menu.get_by_label("Status text").fill("Away <for> lunch")
    b.status_menu.get_by_label("Clear the text and emoji").select_option(label="in 1 hour")
    with b.page.expect_navigation():
        b.status_menu.get_by_role("button", name="Save status").click()
    assert b.page.url == people_page  # back where the menu was
    summary = b.page.locator("[data-presence-status-summary]")
    expect(summary).to_have_text("Away <for> lunch")
    expect(a.dot(ben)).to_have_class(DND)  # ann's page, live
    assert b.status_menu.locator('select[name="expires"]').input_value() == "keep"
    assert b.frames_sent == [] and b.http_requests == []  # no script ran


SET = "(change) => window.presence.setStatus(change)"


def summary_of(session: Any) -> Any:
    return session.page.locator("[data-presence-status-summary]")


def test_a_change_made_in_another_tab_reaches_the_menu_and_a_new_mode_keeps_it(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    """ben sets "🎧 Focus", clearing in an hour, in another tab: this page's menu shows it (the
    button, the fields, the time as set, from ben's own presence), so choosing only "Do not
    disturb" here keeps the text, the emoji and when they clear."""
    ann, ben = people["ann"], people["ben"]
    a = browser.open(ann, live.url)
    b = browser.open(ben, live.url)
    b.wait_connected()
    other_tab = b.context.new_page()
    other_tab.goto(live.url + "/")
    other_tab.wait_for_function("() => window.presence && window.presence.state === 'open'")
    change = {"status": "auto", "text": "Focus", "emoji": "🎧", "expires_in": 3600}
    own = other_tab.evaluate(SET, change)
    clears = datetime.fromisoformat(own["expires_at"])
    menu = b.status_menu
    expect(summary_of(b)).to_have_text("🎧 Focus")
    expect(menu.get_by_label("Status text")).to_have_value("Focus")
    expect(menu.get_by_label("Emoji", exact=True)).to_have_value("🎧")
    expect(keep_option(menu)).to_have_count(1)
    assert clears_at(keep_option(menu)) == clears
    assert menu.locator('select[name="expires"]').input_value() == "keep"

    menu.locator("summary").click()
    menu.get_by_role("radio", name="Do not disturb").check()
    menu.get_by_role("button", name="Save status").click()
    expect(a.dot(ben)).to_have_class(DND)
    sent = [f for f in b.frames_sent if f["type"] == "set_status"][-1]
    assert (sent["status"], sent["text"], sent["emoji"]) == ("dnd", "Focus", "🎧")
    left = (clears - datetime.now(UTC)).total_seconds()
    assert abs(sent["expires_in"] - left) <= 2  # when it cleared, not never
    seen = a.refresh()[str(ben.pk)]
    assert (seen["status"], seen["text"], seen["emoji"]) == ("dnd", "Focus", "🎧")


def test_a_clearing_time_set_by_other_code_is_kept_by_a_new_mode(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    ben = people["ben"]
    b = browser.open(ben, live.url)
    b.wait_connected()
    change = {"status": "auto", "text": "Lunch", "emoji": None, "expires_in": 3600}
    clears = datetime.fromisoformat(b.page.evaluate(SET, change)["expires_at"])
    menu = b.status_menu
    expect(keep_option(menu)).to_have_count(1)
    assert clears_at(keep_option(menu)) == clears
    b.set_status("Do not disturb", text="Lunch")
    expect(menu).not_to_have_attribute("open", "")
    sent = [f for f in b.frames_sent if f["type"] == "set_status"][-1]
    assert sent["status"] == "dnd" and sent["text"] == "Lunch"
    assert abs(sent["expires_in"] - (clears - datetime.now(UTC)).total_seconds()) <= 2


def test_a_custom_status_that_clears_leaves_the_menu_at_once(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    ben = people["ben"]
    b = browser.open(ben, live.url)
    b.wait_connected()
    b.page.evaluate(SET, {"status": "dnd", "text": "Short", "emoji": "⏳", "expires_in": 2})
    expect(summary_of(b)).to_have_text("⏳ Short")
    # Cleared by the server's sweep, and told to ben's page as to everyone's.
    expect(summary_of(b)).to_have_text("Set status", timeout=(2 + MARGIN) * 1000)
    menu = b.status_menu
    expect(menu.get_by_label("Status text")).to_have_value("")
    expect(keep_option(menu)).to_have_count(0)
    assert menu.locator('select[name="expires"]').input_value() == "never"
    assert menu.locator('input[name="status"][value="dnd"]').is_checked()  # dnd stays


def test_the_time_as_set_is_written_in_the_sites_time_zone(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    """The site's time zone is UTC, the browser's Los Angeles: the menu writes the time it set
    as the server does, in UTC."""
    ben = people["ben"]
    b = browser.open(ben, live.url, timezone_id="America/Los_Angeles")
    b.wait_connected()
    b.set_status("Automatic — online while you are active", text="Focus", expires="in 4 hours")
    menu = b.status_menu
    expect(menu).not_to_have_attribute("open", "")
    keep = keep_option(menu)
    expect(keep).to_have_count(1)
    at = clears_at(keep)

    def clock(moment: datetime) -> str:
        return f"{moment.hour % 12 or 12}:{moment.minute:02d}"

    label = keep.text_content() or ""
    assert clock(at.astimezone(UTC)) in label, label
    assert clock(at.astimezone(ZoneInfo("America/Los_Angeles"))) not in label, label


def test_a_refusal_is_not_shown_again_once_the_menu_was_closed(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    ben = people["ben"]
    b = browser.open(ben, live.url)
    b.wait_connected()
    b.allowed.append("control characters")  # the refusal, reported on the console
    b.set_status("Do not disturb", text="bad\u202etext")
    menu = b.status_menu
    error = menu.locator("[data-presence-status-error]")
    expect(error).to_be_visible()
    menu.get_by_label("Status text").press("Escape")
    expect(menu).not_to_have_attribute("open", "")
    menu.locator("summary").click()
    expect(error).to_be_hidden()
