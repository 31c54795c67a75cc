"""{% online_count %} in a real browser: presence.js asks the socket for the count once the page
shows one, and rewrites it live as people come online (at most one update per 5 s), in the
page's number format. The browser, the servers and the people: tests/browser/pages.py.
"""

from __future__ import annotations

from typing import Any

from tests.browser.pages import MARGIN, Browser, expect
from tests.browser.pages import browser as browser
from tests.browser.pages import chromium as chromium
from tests.browser.pages import live as live
from tests.browser.pages import people as people
from tests.daphne import Daphne, daphne_fixture  # noqa: F401 (the daphne fixture)

#: what {% online_count %} renders (tests/store/test_online_count.py checks the tag itself)
COUNT = (
    '<span class="presence-online-count" data-presence-online-count="/presence/api/online_count"'
    ' data-testid="count">0</span>'
)


def test_the_online_count_goes_up_live_as_a_friend_logs_in(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    ann, ben = people["ann"], people["ben"]
    a = browser.open(ann, live.url)
    a.wait_connected()
    a.page.evaluate(f"() => document.body.insertAdjacentHTML('beforeend', {COUNT!r})")
    count = a.page.get_by_test_id("count")
    expect(count).to_have_text("1")  # ann herself, answered at once

    browser.open(ben, live.url)
    # Pushed within the 5 s the server waits between two updates to a socket.
    expect(count).to_have_text("2", timeout=(5 + MARGIN) * 1000)
    assert [f for f in a.frames_sent if f["type"] == "watch_count"] == [{"type": "watch_count"}]
    counts = [f["count"] for f in a.frames_received if f["type"] == "online_count"]
    assert counts == [1, 2]
    assert a.http_requests == []  # pushed, not polled
