"""The status menu's script (presence/status-menu.js) against the real {% presence_status_menu %}
markup, with presence.js whose socket never opens (setStatus posts, to a fetch the test reads)
and the page's clock moved by the test: the clearing time it sends for a page left open.

The menu end to end against daphne: tests/browser/test_browser_status_menu.py; its markup:
tests/core/test_status_menu.py."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.test import RequestFactory
from django.utils import timezone

from presence import api
from presence.pages.forms import next_midnight
from presence.pages.menu import status_menu
from tests.browser.pages import CHROMIUM, CHROMIUM_ARGS
from tests.browser.test_client_rules import STATIC, Client, sync_api
from tests.browser.test_client_rules import client as client

pytestmark = pytest.mark.django_db

STATUS_ENDPOINT = "/presence/api/status"
HOUR_MS = 3600 * 1000


class LazyChromium:
    """Chromium launched when the first page opens: Playwright's sync API holds an event loop,
    under which Django refuses the database, so the test reads it (the menu) before."""

    def __init__(self) -> None:
        self.playwright: Any = None
        self.browser: Any = None

    def new_context(self) -> Any:
        if self.browser is None:
            self.playwright = sync_api.sync_playwright().start()
            self.browser = self.playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
        return self.browser.new_context()

    def close(self) -> None:
        if self.playwright is not None:
            try:
                self.browser.close()
            finally:
                self.playwright.stop()


@pytest.fixture
def chromium_browser(db: Any) -> Iterator[LazyChromium]:
    """test_client_rules' browser (for its ``client``), one per test, after the database."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Chromium not found at {CHROMIUM}: apt-get install chromium (CI installs it)")
    browser = LazyChromium()
    yield browser
    browser.close()


def menu_page(client: Callable[..., Client], user: Any, rendered_at: datetime) -> Client:
    """A page with the menu the server rendered at ``rendered_at``, and its script."""
    request = RequestFactory().get("/")
    request.user = user
    with time_machine.travel(rendered_at, tick=False):
        html = str(status_menu(request))
    # the script is added once the page runs (the route serves presence.js only)
    c = client(html.replace('<script src="/static/presence/status-menu.js" defer></script>', ""))
    c.page.add_script_tag(content=(STATIC / "status-menu.js").read_text())
    return c


def save(c: Client, expires: str) -> tuple[list[Any], str | None]:
    """Saves "Lunch" with the clearing choice ``expires``: the posts' ``expires_in``, and the
    refusal the menu shows (None: none)."""
    c.js("() => { document.querySelector('details').open = true; }")
    c.page.fill("input[name=text]", "Lunch")
    c.page.select_option("select[name=expires]", expires)
    c.page.click("button[type=submit]")
    bodies: list[str] = c.js(
        "(path) => window.__fetches.filter((f) => f.url.startsWith(path)).map((f) => f.body)",
        STATUS_ENDPOINT,
    )
    error = c.js(
        "() => { const e = document.querySelector('[data-presence-status-error]');"
        " return e.hidden ? null : e.textContent; }"
    )
    return [json.loads(body)["expires_in"] for body in bodies], error


def test_at_midnight_on_a_page_left_open_past_it_is_the_next_midnight(
    client: Callable[..., Client], make_user: Callable[..., Any]
) -> None:
    # Rendered at 09:30 UTC: "at midnight" is 2030-01-08 00:00.
    c = menu_page(client, make_user("ann"), datetime(2030, 1, 7, 9, 30, tzinfo=UTC))
    c.page.clock.fast_forward(25 * HOUR_MS)  # a day and an hour later: 10:30 on the 8th
    sent, error = save(c, "today")
    assert error is None
    assert sent == [13 * 3600 + 30 * 60]  # until the 9th's midnight


def test_at_midnight_is_the_site_zones_across_a_change_of_the_clocks(
    client: Callable[..., Client], make_user: Callable[..., Any]
) -> None:
    # Paris moves its clocks on 2030-03-31 (02:00 -> 03:00): a day of 23 hours.
    with timezone.override("Europe/Paris"):
        c = menu_page(client, make_user("ann"), datetime(2030, 3, 30, 11, 0, tzinfo=UTC))
    c.page.clock.fast_forward(24 * HOUR_MS)  # 2030-03-31 13:00 in Paris (11:00 UTC)
    sent, error = save(c, "today")
    assert error is None
    # Paris's midnight of April 1st (22:00 UTC), not 24 hours after the last one's.
    assert sent == [11 * 3600]


def test_a_time_as_set_that_has_passed_is_still_refused(
    client: Callable[..., Client], make_user: Callable[..., Any]
) -> None:
    ann = make_user("ann")
    rendered_at = datetime(2030, 1, 7, 9, 30, tzinfo=UTC)
    with time_machine.travel(rendered_at, tick=False):
        api.set_status(ann, "auto", text="Away", expires_at=datetime(2030, 1, 7, 11, tzinfo=UTC))
    c = menu_page(client, ann, rendered_at)
    c.page.clock.fast_forward(2 * HOUR_MS)  # 11:30: past the time as set
    sent, error = save(c, "keep")
    assert sent == []
    assert error == "That time has passed: choose when to clear again."


@pytest.mark.parametrize(
    ("zone", "rendered_at"),
    [
        # Clocks that move forward at midnight (00:00 -> 01:00): the new day starts at 01:00.
        ("America/Santiago", datetime(2026, 9, 4, 15, 0, tzinfo=UTC)),
        ("Atlantic/Azores", datetime(2026, 3, 27, 12, 0, tzinfo=UTC)),
        ("Africa/Cairo", datetime(2026, 4, 22, 12, 0, tzinfo=UTC)),
        # Rendered on that day: its "at midnight" is 01:00, the next one 00:00 again.
        ("America/Santiago", datetime(2026, 9, 5, 15, 0, tzinfo=UTC)),
        # Clocks that move back at midnight (00:00 -> 23:00 the evening before).
        ("America/Santiago", datetime(2026, 4, 3, 15, 0, tzinfo=UTC)),
    ],
)
def test_at_midnight_is_the_servers_where_the_clocks_change_at_midnight(
    client: Callable[..., Client], make_user: Callable[..., Any], zone: str, rendered_at: datetime
) -> None:
    with timezone.override(zone):
        c = menu_page(client, make_user("ann"), rendered_at)
        used_at = rendered_at + timedelta(days=1)  # past the midnight the menu was rendered with
        wanted = next_midnight(used_at)  # what the settings page's form would save
    c.page.clock.fast_forward(24 * HOUR_MS)
    sent, error = save(c, "today")
    assert error is None
    assert sent == [round((wanted - used_at).total_seconds())]
