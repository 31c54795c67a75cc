"""The demo site and presence.js in a real browser: headless Debian Chromium driven by Playwright.

Two kinds of server:

- **Live** (most tests): the demo run by real daphne processes (tests/daphne.py) on the test
  database, with small ``PRESENCE`` timings; presence.js talks to ``ws/presence/``. Everything
  waits for a DOM condition with Playwright's ``expect`` (bounded by a timeout), never for a
  fixed time.
- **Polling fallback**: pytest-django's ``live_server`` (a WSGI thread of this process: no
  WebSockets), with ``window.WebSocket`` removed from the pages, so presence.js polls the JSON
  endpoint and POSTs status changes. It shares this process's controlled clock: the offline grace
  is crossed with ``clock.shift()``.

Needs /usr/bin/chromium (``apt-get install chromium``); skipped otherwise. Never run
``playwright install``: the system Chromium is used.

This module: the browser, the servers and the people the tests share (tests/browser/test_*.py).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from django.urls import reverse

from presence.models import Contact
from tests.daphne import Daphne, daphne_fixture  # noqa: F401 (the daphne fixture)

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]' (playwright)")
expect = sync_api.expect
CHROMIUM = "/usr/bin/chromium"
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
#: what the daphne processes run with: heartbeats every second, a crashed connection gone after
#: 3 s, sweeps every 0.2 s; IDLE_AFTER long enough that no test goes idle unless it wants to
LIVE = {
    "HEARTBEAT_INTERVAL": 1,
    "CONNECTION_TTL": 3,
    "OFFLINE_GRACE": GRACE,
    "IDLE_AFTER": 600,
    "SWEEP_INTERVAL": 0.2,
}
MARGIN = 4  # seconds allowed past a deadline for the sweep, the coalescing window, a slow CI
ONLINE = re.compile(r"\bpresence-dot--online\b")
IDLE = re.compile(r"\bpresence-dot--idle\b")
DND = re.compile(r"\bpresence-dot--dnd\b")
OFFLINE = re.compile(r"\bpresence-dot--offline\b")
REFRESH = "() => window.presence.refresh()"
API_PATH = "/presence/api/presence"
STATUS_PATH = "/presence/api/status"
NO_WEBSOCKET = "delete window.WebSocket;"
#: record every "update" and "connection" event of presence.js from the start of each page
RECORDER = """
window.__presence = {updates: [], states: []};
document.addEventListener("presence:update", (e) => window.__presence.updates.push(e.detail));
document.addEventListener("presence:connection",
    (e) => window.__presence.states.push(e.detail.state));
"""


def opening_subscription(url: str) -> dict[str, Any] | None:
    """The subscribe frame a socket's opening request stands for (presence.js puts the page's
    users in the URL: ``?users=ID,ID&since=STAMP``), or None."""
    fields = dict(part.partition("=")[::2] for part in urlsplit(url).query.split("&") if part)
    if "users" not in fields:
        return None
    users = [unquote(part) for part in fields["users"].split(",")] if fields["users"] else []
    return {"type": "subscribe", "users": users, "since": unquote(fields.get("since", "")) or None}


@pytest.fixture
def chromium() -> str:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Chromium not found at {CHROMIUM}: apt-get install chromium (CI installs it)")
    return CHROMIUM


@dataclass
class Session:
    """One user's browser context (own cookies) and page, with what went wrong in it."""

    user: Any
    context: Any
    page: Any
    base_url: str
    errors: list[str] = field(default_factory=list)
    #: console errors this test expects (a server it stopped on purpose), as regexes
    allowed: list[str] = field(default_factory=list)
    http_requests: list[str] = field(default_factory=list)
    frames_sent: list[dict[str, Any]] = field(default_factory=list)
    frames_received: list[dict[str, Any]] = field(default_factory=list)
    sockets: list[Any] = field(default_factory=list)  # Playwright's WebSocket objects

    def console(self, message: Any) -> None:
        if message.type != "error":
            return
        if any(re.search(pattern, message.text) for pattern in self.allowed):
            return
        self.errors.append(f"console: {message.text} at {message.location}")

    def on_websocket(self, ws: Any) -> None:
        self.sockets.append(ws)
        opening = [subscription] if (subscription := opening_subscription(ws.url)) else []

        def sent(payload: str) -> None:
            # The opening request's subscription stands for the subscribe frame it replaces,
            # counted once the socket opened (its first frame: the heartbeat at open), not for
            # each attempt a server that is away refused.
            self.frames_sent.extend(opening)
            opening.clear()
            self.frames_sent.append(json.loads(payload))

        ws.on("framesent", sent)
        ws.on("framereceived", lambda payload: self.frames_received.append(json.loads(payload)))

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

    def last_seen(self, user: Any) -> Any:
        return self.page.locator(f'[data-presence-last-seen="{user.pk}"]').first

    def wait_connected(self, timeout: float = WAIT_MS) -> None:
        self.page.wait_for_function(
            "() => window.presence && window.presence.state === 'open'", timeout=timeout
        )

    def wait_received(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = WAIT_MS
    ) -> dict[str, Any]:
        """The first frame received that ``predicate`` accepts, waiting up to ``timeout`` ms
        (Playwright delivers frames while the page is waited on)."""
        for _ in range(int(timeout / 50) + 1):
            found = next((f for f in self.frames_received if predicate(f)), None)
            if found is not None:
                return found
            self.page.wait_for_timeout(50)
        raise AssertionError(f"no such frame within {timeout} ms: {self.frames_received}")

    def refresh(self) -> dict[str, Any]:
        """presence.js's own refresh: resolves to {id: presence}."""
        result: dict[str, Any] = self.page.evaluate(REFRESH)
        return result

    def statuses_of(self, user: Any) -> list[str]:
        """The statuses presence.js rendered for ``user`` on this page, in order."""
        result: list[str] = self.page.evaluate(
            "(pk) => window.__presence.updates.filter((u) => u.presences[pk])"
            ".map((u) => u.presences[pk].status)",
            str(user.pk),
        )
        return result

    @property
    def status_menu(self) -> Any:
        """The header's status menu ({% presence_status_menu %})."""
        return self.page.locator("[data-presence-status-menu]")

    def set_status(self, status: str, text: str = "", emoji: str = "", expires: str = "") -> None:
        """Through the header's status menu."""
        menu = self.status_menu
        if not menu.evaluate("(details) => details.open"):
            menu.locator("summary").click()
        menu.get_by_role("radio", name=status).check()
        menu.get_by_label("Emoji", exact=True).fill(emoji)
        menu.get_by_label("Status text").fill(text)
        if expires:
            menu.get_by_label("Clear the text and emoji").select_option(label=expires)
        menu.get_by_role("button", name="Save status").click()


class Browser:
    """Chromium, started with the first session.

    Playwright's sync API runs an asyncio loop in this thread while it is started, and Django
    refuses database calls under a running loop. So it starts with the first session, once the
    test has written its rows, and stops before the database is flushed.
    """

    def __init__(self, executable: str) -> None:
        self.executable = executable
        self.sessions: list[Session] = []
        self.playwright: Any = None
        self.browser: Any = None

    def open(
        self,
        user: Any,
        base_url: str,
        *,
        websocket: bool = True,
        log_in: bool = True,
        server: Callable[[Any], None] | None = None,
        javascript: bool = True,
        timezone_id: str | None = None,
    ) -> Session:
        """``websocket=False`` removes WebSocket from the pages; ``server`` answers their
        WebSockets instead of the real server (Playwright's ``route_web_socket``);
        ``javascript=False``: a browser that runs no script (plain forms and links);
        ``timezone_id``: the browser's time zone (else the machine's)."""
        if self.browser is None:
            self.playwright = sync_api.sync_playwright().start()
            self.browser = self.playwright.chromium.launch(
                executable_path=self.executable, headless=True, args=CHROMIUM_ARGS
            )
        context = self.browser.new_context(
            locale="en-US", java_script_enabled=javascript, timezone_id=timezone_id
        )
        context.set_default_timeout(WAIT_MS)
        context.add_init_script(RECORDER if websocket else NO_WEBSOCKET + RECORDER)
        if server is not None:
            context.route_web_socket(re.compile(r"/ws/presence/"), server)
        page = context.new_page()
        session = Session(user, context, page, base_url)
        page.on("console", session.console)
        page.on("pageerror", lambda exc: session.errors.append(f"pageerror: {exc}"))
        page.on("websocket", session.on_websocket)
        page.on(
            "request",
            lambda req: (
                session.http_requests.append(req.url)
                if urlsplit(req.url).path in (API_PATH, STATUS_PATH)
                else None
            ),
        )
        self.sessions.append(session)
        if log_in:
            session.log_in()
        return session

    def close(self) -> dict[str, list[str]]:
        """Closes everything; returns the errors each user's pages logged."""
        if self.browser is not None:
            try:
                self.browser.close()
            finally:
                self.playwright.stop()
        return {s.user.username: s.errors for s in self.sessions if s.errors}


@pytest.fixture
def browser(chromium: str, daphne: Callable[..., Daphne]) -> Iterator[Browser]:
    """At the end, no page may have logged a console error or thrown an uncaught exception.
    (Requests the daphne fixture so that its servers stop after the pages are closed.)"""
    b = Browser(chromium)
    yield b
    errors = b.close()
    assert not errors, f"browser errors: {errors}"


@pytest.fixture
def people(make_user: Callable[..., Any]) -> dict[str, Any]:
    """ann and ben are friends (each follows the other); cy knows neither."""
    ann, ben, cy = make_user("ann"), make_user("ben"), make_user("cy")
    Contact.objects.create(owner=ann, contact=ben)
    Contact.objects.create(owner=ben, contact=ann)
    return {"ann": ann, "ben": ben, "cy": cy}


@pytest.fixture
def live(daphne: Callable[..., Daphne], people: dict[str, Any]) -> Daphne:
    """The demo served by daphne (after the people exist: the server reads them)."""
    return daphne(LIVE)


# --- for test_browser_polling.py (polling fallback) -------------------------------------------


def presence(status: str, **fields: Any) -> dict[str, Any]:
    base = {
        "last_seen": None,
        "last_seen_approx": None,
        "devices": [],
        "text": None,
        "emoji": None,
        "activity": None,
    }
    return {"status": status, **base, **fields}
