"""presence's settings page (presence:settings) in a real browser, in the demo's layout: every
field set through the page, by label and partly by keyboard, then the stored values checked;
the contact search filters the list as one types (presence/settings.js).

Uses the browser of tests/browser/ (headless Debian Chromium via Playwright; skipped
without /usr/bin/chromium) against pytest-django's ``live_server``, without WebSockets.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from presence.models import Contact, PrivacyException, PrivacySettings, UserStatus
from tests.browser.pages import Browser, browser, chromium, expect, live, people  # noqa: F401
from tests.browser.test_browser_feed import in_thread
from tests.daphne import daphne_fixture  # noqa: F401 (the browser fixture's daphne)

pytestmark = pytest.mark.django_db(transaction=True)


def test_every_field_is_saved_through_the_page(
    browser: Browser,  # noqa: F811
    live_server: Any,
    people: dict[str, Any],  # noqa: F811
) -> None:
    ann, ben, cy = people["ann"], people["ben"], people["cy"]
    Contact.objects.create(owner=ann, contact=cy)  # ann's contacts: ben and cy
    a = browser.open(ann, live_server.url, websocket=False)
    page = a.page
    page.get_by_role("navigation").get_by_role("link", name="Privacy").click()
    page.wait_for_url(a.url("presence:settings"))
    expect(page.get_by_role("heading", level=1)).to_have_text("Privacy and status")
    form = page.locator("form[data-presence-settings]")  # not the header's status menu

    # The three levels: radio groups named by their legends.
    for legend, level in [
        ("Who sees when I am online", "Everyone"),
        ("Who sees my last seen", "Close friends"),
        ("Who sees my custom status and activity", "Nobody"),
    ]:
        form.get_by_role("group", name=legend).get_by_role("radio", name=level).check()
    # The status, by keyboard: the arrow key moves the choice within the group.
    shown_as = form.get_by_role("group", name="Show me as")
    shown_as.get_by_role("radio", name="Automatic — online while you are active").focus()
    page.keyboard.press("ArrowDown")
    expect(shown_as.get_by_role("radio", name="Do not disturb")).to_be_checked()
    form.get_by_label("Emoji", exact=True).fill("🎧")
    form.get_by_label("Status text", exact=True).fill("Deep work")
    form.get_by_label("Clear the text and emoji").select_option(label="in 4 hours")

    # The search filters the people as one types (no request).
    search = form.get_by_label("Find a contact")
    person = form.locator("fieldset[data-presence-person]")
    search.fill("c")
    expect(person.filter(has_text="ben")).to_be_hidden()
    cy_row = form.get_by_role("group", name="cy")
    cy_row.get_by_label("When I am online").select_option(label="Never share")
    search.fill("zz")
    expect(form.get_by_text("None of the people listed matches.")).to_be_visible()
    search.fill("")
    ben_row = form.get_by_role("group", name="ben")
    expect(ben_row).to_be_visible()
    ben_row.get_by_label("My last seen").select_option(label="Always share")
    ben_row.get_by_label("My status text and emoji").select_option(label="Never share")

    # Saved from the keyboard; the focus shows.
    save = form.get_by_role("button", name="Save", exact=True)
    save.focus()
    page.keyboard.press("Tab")
    page.keyboard.press("Shift+Tab")
    assert save.evaluate("(b) => getComputedStyle(b).outlineStyle") == "solid"
    saved_at = timezone.now()
    page.keyboard.press("Enter")
    page.wait_for_url(a.url("presence:settings"))
    expect(page.get_by_text("Your settings are saved.")).to_be_visible()

    row = in_thread(lambda: PrivacySettings.objects.get(user=ann))
    assert (row.online_visibility, row.last_seen_visibility, row.activity_visibility) == (
        "everyone",
        "close_friends",
        "nobody",
    )
    assert row.invisible is False
    status = in_thread(lambda: UserStatus.objects.get(user=ann))
    assert (status.dnd, status.text, status.emoji) == (True, "Deep work", "🎧")
    assert status.expires_at is not None
    assert abs(status.expires_at - (saved_at + timedelta(hours=4))) < timedelta(minutes=1)
    exceptions = in_thread(
        lambda: sorted(
            PrivacyException.objects.filter(owner=ann).values_list(
                "viewer__username", "setting", "allow"
            )
        )
    )
    assert exceptions == [
        ("ben", "activity_visibility", False),
        ("ben", "last_seen_visibility", True),
        ("cy", "online_visibility", False),
    ]

    # The page shows what is stored; invisible, and an exception removed.
    expect(form.get_by_label("Status text", exact=True)).to_have_value("Deep work")
    expect(form.get_by_label("Clear the text and emoji")).to_have_value("keep")
    shown_as.get_by_role("radio", name="Invisible — appear offline to everyone").check()
    form.get_by_role("group", name="ben").get_by_label("My last seen").select_option(
        label="As set above"
    )
    save.click()
    expect(page.get_by_text("Your settings are saved.")).to_be_visible()
    assert in_thread(lambda: PrivacySettings.objects.get(user=ann).invisible) is True
    assert in_thread(lambda: UserStatus.objects.get(user=ann).text) == "Deep work"
    assert in_thread(lambda: PrivacyException.objects.filter(owner=ann, viewer=ben).count()) == 1


def test_a_bad_value_is_shown_on_the_page_and_nothing_is_saved(
    browser: Browser,  # noqa: F811
    live_server: Any,
    people: dict[str, Any],  # noqa: F811
) -> None:
    ann = people["ann"]
    a = browser.open(ann, live_server.url, websocket=False)
    a.page.goto(a.url("presence:settings"))
    form = a.page.locator("form[data-presence-settings]")
    form.get_by_role("group", name="Who sees when I am online").get_by_role(
        "radio", name="Nobody"
    ).check()
    # A text past the limit (the input's maxlength stops typing, not a script).
    form.get_by_label("Status text", exact=True).evaluate(
        "(input) => input.removeAttribute('maxlength')"
    )
    form.get_by_label("Status text", exact=True).fill("x" * 141)
    form.get_by_role("button", name="Save", exact=True).click()
    expect(a.page.get_by_role("alert").first).to_contain_text("Nothing was saved")
    expect(a.page.get_by_text("Ensure this value has at most 140 characters")).to_be_visible()
    assert not in_thread(PrivacySettings.objects.filter(user=ann).exists)
    assert not in_thread(UserStatus.objects.filter(user=ann).exists)
