"""The demo site and presence.js in a real browser: headless Debian Chromium driven by Playwright.

The demo is served by pytest-django's ``live_server`` (a thread of this process, static files
included through ``django.contrib.staticfiles``), so it shares this process's settings, the
throttle and the controlled clock: the ``clock`` fixture freezes ``time.time()`` for the server
too, and the offline grace is crossed with ``clock.shift()`` instead of waiting. Chromium keeps its
own (real) clock; nothing here depends on it.

Needs /usr/bin/chromium (``apt-get install chromium``); skipped otherwise. Never run
``playwright install``: the system Chromium is used.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse

from presence.models import Contact
from tests.clock import T0

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]' (playwright)")
expect = sync_api.expect

CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
#: bound on every wait for the page: generous for a slow CI machine, never a fixed pause
WAIT_MS = 10_000
expect.set_options(timeout=WAIT_MS)
GRACE = 2  # OFFLINE_GRACE for these tests, unlike the default 5, to show the server reads it
ONLINE = re.compile(r"\bpresence-dot--online\b")
OFFLINE = re.compile(r"\bpresence-dot--offline\b")
REFRESH = "() => window.presence.refresh()"
API_PATH = "/presence/api/presence"


@pytest.fixture
def chromium() -> str:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip(
            "Chromium not found at /usr/bin/chromium: apt-get install chromium (CI installs it)"
        )
    return executable


@dataclass
class Session:
    """One user's browser context (own cookies) and page, with what went wrong in it."""

    user: Any
    context: Any
    page: Any
    base_url: str
    errors: list[str] = field(default_factory=list)
    presence_requests: list[str] = field(default_factory=list)

    def console(self, message: Any) -> None:
        if message.type != "error":
            return
        self.errors.append(f"console: {message.text} at {message.location}")

    def url(self, name: str, *args: Any) -> str:
        return self.base_url + reverse(name, args=args)

    def log_in(self) -> None:
        # Through the demo's login form, so the login signal runs as in real use.
        self.page.goto(self.url("demo:login"))
        self.page.get_by_label("Username").fill(self.user.username)
        self.page.get_by_label("Password").fill("pw")  # make_user's password
        self.page.get_by_role("button", name="Log in").click()
        self.page.wait_for_url(self.url("demo:home"))

    def log_out(self) -> None:
        self.page.get_by_role("button", name="Log out").click()  # a POST form
        self.page.wait_for_url(self.url("demo:login"))

    def dot(self, user: Any) -> Any:
        # The server-rendered dot; dots injected by the tests carry a data-testid instead.
        return self.page.locator(
            f'.presence-dot[data-presence-user="{user.pk}"]:not([data-testid])'
        ).first

    def refresh(self) -> dict[str, Any]:
        """presence.js's own refresh: fetches, renders, resolves to {id: presence}."""
        result: dict[str, Any] = self.page.evaluate(REFRESH)
        return result


@pytest.fixture
def open_session(chromium: str, live_server: Any) -> Iterator[Callable[[Any], Session]]:
    """Opens a logged-in browser session for a user; at the end, no session may have logged a
    console error or thrown an uncaught exception.

    Playwright's sync API runs an asyncio loop in this thread while it is started, and Django
    refuses database calls under a running loop. So it starts with the first session, once the
    test's fixtures have written their rows, and stops before the database is flushed.
    """
    sessions: list[Session] = []
    started: list[Any] = []  # the Playwright instance and the browser, once started

    def open_(user: Any) -> Session:
        if not started:
            playwright = sync_api.sync_playwright().start()
            started.append(playwright)
            started.append(
                playwright.chromium.launch(
                    executable_path=chromium, headless=True, args=CHROMIUM_ARGS
                )
            )
        context = started[1].new_context(locale="en-US")
        context.set_default_timeout(WAIT_MS)
        page = context.new_page()
        session = Session(user, context, page, live_server.url)
        page.on("console", lambda msg: session.console(msg))
        page.on("pageerror", lambda exc: session.errors.append(f"pageerror: {exc}"))
        page.on(
            "request",
            lambda req: (
                session.presence_requests.append(req.url)
                if urlsplit(req.url).path == API_PATH
                else None
            ),
        )
        sessions.append(session)
        session.log_in()
        return session

    yield open_
    if started:
        playwright, browser = started
        try:
            browser.close()
        finally:
            playwright.stop()
    errors = {s.user.username: s.errors for s in sessions if s.errors}
    assert not errors, f"browser errors: {errors}"


@pytest.fixture
def people(make_user: Callable[..., Any]) -> dict[str, Any]:
    """ann and ben are friends (each follows the other); cy knows neither."""
    ann, ben, cy = make_user("ann"), make_user("ben"), make_user("cy")
    Contact.objects.create(owner=ann, contact=ben)
    Contact.objects.create(owner=ben, contact=ann)
    return {"ann": ann, "ben": ben, "cy": cy}


@pytest.fixture
def grace(settings: Any) -> int:
    settings.PRESENCE = {"OFFLINE_GRACE": GRACE}
    return GRACE


def test_a_friend_goes_online_and_offline_without_reload(
    open_session: Callable[[Any], Session], people: dict[str, Any], clock: Any, grace: int
) -> None:
    ann, ben = people["ann"], people["ben"]
    a = open_session(ann)
    expect(a.dot(ben)).to_have_class(OFFLINE)
    a.page.evaluate("() => { window.loadedOnce = true; }")  # gone if the page reloads

    b = open_session(ben)  # the login signal records ben online
    presences = a.refresh()
    assert presences[str(ben.pk)]["status"] == "online"
    expect(a.dot(ben)).to_have_class(ONLINE)
    expect(a.dot(ben)).to_have_attribute("title", "Online")
    expect(a.page.locator(f'[data-presence-last-seen="{ben.pk}"]')).to_have_text("online")

    b.log_out()
    # Logged out, ben stays online to others for the grace (a reload or a quick reconnect
    # must not flicker); the clock stands still, so this is exactly at the logout.
    assert a.refresh()[str(ben.pk)]["status"] == "online"
    clock.shift(grace - 0.5)
    assert a.refresh()[str(ben.pk)]["status"] == "online"
    expect(a.dot(ben)).to_have_class(ONLINE)

    # Past the grace (still well within the default 5 s: the live server reads the test's
    # settings), the same page turns ben grey.
    clock.shift(1)
    presences = a.refresh()
    assert presences[str(ben.pk)]["status"] == "offline"
    # A friend may see when: the logout time, recorded by the server's (controlled) clock.
    assert presences[str(ben.pk)]["last_seen"] == T0.isoformat()
    expect(a.dot(ben)).to_have_class(OFFLINE)
    expect(a.dot(ben)).not_to_have_class(ONLINE)
    expect(a.dot(ben)).to_have_attribute("title", "Offline")
    assert a.page.evaluate("() => window.loadedOnce") is True


def test_a_stranger_sees_an_online_user_offline_and_no_last_seen(
    open_session: Callable[[Any], Session], people: dict[str, Any]
) -> None:
    ann, ben, cy = people["ann"], people["ben"], people["cy"]
    open_session(ben)
    c = open_session(cy)
    c.page.goto(c.url("demo:profile", ben.username))
    expect(c.dot(ben)).to_have_class(OFFLINE)

    with c.page.expect_response(lambda r: urlsplit(r.url).path == API_PATH) as answer:
        c.refresh()
    response = answer.value
    assert response.status == 200
    seen_by_stranger = response.json()["presences"][str(ben.pk)]
    assert seen_by_stranger["status"] == "offline"
    assert seen_by_stranger["last_seen"] is None
    assert seen_by_stranger["devices"] == []
    expect(c.dot(ben)).to_have_class(OFFLINE)
    expect(c.page.locator(f'[data-presence-last-seen="{ben.pk}"]')).to_have_text("")

    # The same endpoint tells a friend that ben is online and since when: what cy got is
    # privacy, not missing data.
    a = open_session(ann)
    seen_by_friend = a.refresh()[str(ben.pk)]
    assert seen_by_friend["status"] == "online"
    assert seen_by_friend["last_seen"]
    # Nowhere in cy's answer, but in cy's own presence (logged in the same second, maybe).
    others = {pk: p for pk, p in response.json()["presences"].items() if pk != str(cy.pk)}
    assert seen_by_friend["last_seen"] not in json.dumps(others)


def test_dots_added_after_load_get_their_status_without_reload(
    open_session: Callable[[Any], Session], people: dict[str, Any]
) -> None:
    ann, ben = people["ann"], people["ben"]
    a = open_session(ann)
    expect(a.dot(ben)).to_have_class(OFFLINE)
    open_session(ben)
    assert a.presence_requests == []  # the first poll is 15 s away: nothing fetched yet

    # As a page would add a list of people: a dot and a last-seen text, no status known.
    a.page.evaluate(
        """(pk) => {
            const item = document.createElement("li");
            item.innerHTML = `<span class="presence-dot" data-presence-user="${pk}"
                data-testid="late-dot"></span><span data-presence-last-seen="${pk}"
                data-testid="late-text"></span>`;
            document.querySelector("main").append(item);
        }""",
        ben.pk,
    )
    late_dot = a.page.get_by_test_id("late-dot")
    expect(late_dot).to_have_class(ONLINE)
    expect(late_dot).to_have_attribute("title", "Online")
    expect(a.page.get_by_test_id("late-text")).to_have_text("online")
    # One request, for the added user only; it also refreshed ben's older dot.
    assert len(a.presence_requests) == 1
    assert parse_qs(urlsplit(a.presence_requests[0]).query)["users"] == [str(ben.pk)]
    expect(a.dot(ben)).to_have_class(ONLINE)

    # A user already fetched is shown at once, from memory: no second request.
    classes = a.page.evaluate(
        """async (pk) => {
            const dot = document.createElement("span");
            dot.className = "presence-dot";
            dot.dataset.presenceUser = pk;
            dot.dataset.testid = "second-dot";
            document.querySelector("main").append(dot);
            await Promise.resolve();  // the MutationObserver's callback runs as a microtask
            return dot.className;
        }""",
        ben.pk,
    )
    assert "presence-dot--online" in classes.split()
    assert len(a.presence_requests) == 1
