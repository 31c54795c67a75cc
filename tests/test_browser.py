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
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse

from presence.models import Contact
from tests.clock import T0
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
        ws.on("framesent", lambda payload: self.frames_sent.append(json.loads(payload)))
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

    def set_status(self, status: str, text: str = "", emoji: str = "", expires: str = "") -> None:
        """Through the header's status menu."""
        menu = self.page.locator("[data-status-menu]")
        if not menu.evaluate("(details) => details.open"):
            menu.locator("summary").click()
        menu.get_by_role("radio", name=status).check()
        menu.get_by_label("Emoji").fill(emoji)
        menu.get_by_label("What's happening?").fill(text)
        if expires:
            menu.get_by_label("Clear status").select_option(label=expires)
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
    ) -> Session:
        """``websocket=False`` removes WebSocket from the pages; ``server`` answers their
        WebSockets instead of the real server (Playwright's ``route_web_socket``)."""
        if self.browser is None:
            self.playwright = sync_api.sync_playwright().start()
            self.browser = self.playwright.chromium.launch(
                executable_path=self.executable, headless=True, args=CHROMIUM_ARGS
            )
        context = self.browser.new_context(locale="en-US")
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


# --- live: the WebSocket client against daphne ------------------------------------------------


def test_a_friend_comes_online_and_leaves_without_reload(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    ann, ben = people["ann"], people["ben"]
    a = browser.open(ann, live.url)
    expect(a.dot(ben)).to_have_class(OFFLINE)
    a.wait_connected()
    a.page.evaluate("() => { window.loadedOnce = true; }")  # gone if the page reloads

    b = browser.open(ben, live.url)  # the real login form, then the home page connects
    expect(a.dot(ben)).to_have_class(ONLINE)
    expect(a.dot(ben)).to_have_attribute("title", "Online")
    expect(a.dot(ben)).to_have_attribute("aria-label", "Online")
    expect(a.last_seen(ben)).to_have_text("online")
    # Pushed, not polled: the page made no HTTP request for presence.
    assert a.http_requests == []
    subscribes = [f for f in a.frames_sent if f["type"] == "subscribe"]
    assert str(ben.pk) in subscribes[0]["users"]
    heartbeats = [f for f in a.frames_sent if f["type"] == "heartbeat"]
    assert heartbeats and {f["state"] for f in heartbeats} == {"active"}

    closed = time.monotonic()
    b.page.close()
    # Grey after OFFLINE_GRACE (a reload must not flicker), not before: the full grace, though
    # the store keeps only the close's second (it may end up to 1 s later, docs/settings.md).
    expect(a.dot(ben)).to_have_class(OFFLINE, timeout=(GRACE + 1 + MARGIN) * 1000)
    elapsed = time.monotonic() - closed
    assert elapsed >= GRACE, f"offline after {elapsed:.2f} s, before the grace"
    expect(a.dot(ben)).to_have_attribute("title", "Offline")
    # A friend sees when: "just now", in the page's language.
    expect(a.last_seen(ben)).to_have_text("just now")
    assert a.page.evaluate("() => window.loadedOnce") is True


def test_the_online_friends_list_follows_a_friend_without_reload(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    """The demo's sidebar ({% online_friends_list %}): ben appears in ann's list when he comes
    online and leaves it after the grace, while the page stays loaded; cy (no friend) never."""
    ann, ben = people["ann"], people["ben"]
    a = browser.open(ann, live.url)
    friends = a.page.locator("[data-presence-friends]")
    count = a.page.locator("[data-presence-friends-count]")
    ben_item = friends.locator(f'[data-presence-friend="{ben.pk}"]')
    expect(ben_item).to_be_hidden()
    expect(count).to_have_text("0")
    expect(friends.locator("[data-presence-friends-empty]")).to_be_visible()
    a.wait_connected()
    a.page.evaluate("() => { window.loadedOnce = true; }")

    b = browser.open(ben, live.url)
    expect(ben_item).to_be_visible()
    expect(ben_item).to_contain_text("ben")
    expect(count).to_have_text("1")
    expect(friends.locator("[data-presence-friends-empty]")).to_be_hidden()
    browser.open(people["cy"], live.url)  # online, but no friend of ann's
    expect(friends.locator("[data-presence-friend]:visible")).to_have_count(1)

    closed = time.monotonic()
    b.page.close()
    expect(ben_item).to_be_hidden(timeout=(GRACE + 1 + MARGIN) * 1000)
    elapsed = time.monotonic() - closed
    # The full grace after the close, never less (docs/settings.md).
    assert elapsed >= GRACE, f"left the list after {elapsed:.2f} s, before the grace"
    expect(count).to_have_text("0")
    assert a.page.evaluate("() => window.loadedOnce") is True


def test_a_reload_does_not_flap(browser: Browser, live: Daphne, people: dict[str, Any]) -> None:
    ann, ben = people["ann"], people["ben"]
    a = browser.open(ann, live.url)
    b = browser.open(ben, live.url)
    expect(a.dot(ben)).to_have_class(ONLINE)
    seen_before = len(a.statuses_of(ben))

    reloaded = time.monotonic()
    b.page.reload()
    b.wait_connected()
    # That nothing happens can only be seen by letting the time pass: the grace and a margin,
    # checking the dot all along.
    while time.monotonic() < reloaded + GRACE + 1.5:
        expect(a.dot(ben)).to_have_class(ONLINE, timeout=500)
        a.page.wait_for_timeout(200)
    assert "offline" not in a.statuses_of(ben)[seen_before:]

    b.page.close()
    expect(a.dot(ben)).to_have_class(OFFLINE, timeout=(GRACE + 1 + MARGIN) * 1000)


def test_status_menu_sets_dnd_over_the_socket(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    ann, ben = people["ann"], people["ben"]
    a = browser.open(ann, live.url)
    b = browser.open(ben, live.url)
    expect(a.dot(ben)).to_have_class(ONLINE)
    b.wait_connected()

    b.set_status("Do not disturb", text="Focus", emoji="🎧", expires="in 1 hour")
    expect(a.dot(ben)).to_have_class(DND)
    expect(a.dot(ben)).to_have_attribute("title", "Do not disturb")
    expect(b.dot(ben)).to_have_class(DND)  # ben's own dot in the header
    expect(b.page.locator("[data-status-summary]")).to_have_text("🎧 Focus")
    sent = [f for f in b.frames_sent if f["type"] == "set_status"]
    assert sent == [
        {
            "type": "set_status",
            "status": "dnd",
            "text": "Focus",
            "emoji": "🎧",
            "expires_in": 3600,
        }
    ]
    replies = [f for f in b.frames_received if f["type"] == "status"]
    assert replies[-1]["presence"]["status"] == "dnd"
    assert replies[-1]["presence"]["text"] == "Focus"
    assert b.http_requests == []  # over the socket, not the HTTP endpoint

    # The server refuses a text over TEXT_MAX_LENGTH; the menu shows its words; nothing changes.
    b.set_status("Automatic — online while you are active", text="x" * 200)
    alert = b.page.locator("[data-status-menu] [role=alert]")
    expect(alert).to_be_visible()
    expect(alert).to_contain_text("text")
    errors = [f for f in b.frames_received if f["type"] == "error"]
    assert errors[-1]["code"] == "invalid_value"
    expect(a.dot(ben)).to_have_class(DND)

    b.set_status("Automatic — online while you are active")
    expect(alert).to_be_hidden()
    expect(a.dot(ben)).to_have_class(ONLINE)
    expect(b.page.locator("[data-status-summary]")).to_have_text("Set status")


def test_a_stranger_never_sees_an_online_user(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    ann, ben, cy = people["ann"], people["ben"], people["cy"]
    c = browser.open(cy, live.url)
    c.page.goto(c.url("demo:profile", ben.username))
    c.wait_connected()
    expect(c.dot(ben)).to_have_class(OFFLINE)
    a = browser.open(ann, live.url)

    b = browser.open(ben, live.url)
    expect(a.dot(ben)).to_have_class(ONLINE)  # the change was fanned out...
    b.set_status("Do not disturb", text="Secret plans", emoji="🤫")
    expect(a.dot(ben)).to_have_class(DND)
    # ... and cy's connection is past it: a reply to cy's own frame comes after anything the
    # server had queued for cy.
    c.page.evaluate("() => window.presence.setStatus({status: 'auto'})")

    expect(c.dot(ben)).to_have_class(OFFLINE)
    expect(c.last_seen(ben)).to_have_text("")
    assert set(c.statuses_of(ben)) == {"offline"}
    about_ben = [
        f["presences"][str(ben.pk)]
        for f in c.frames_received
        if f["type"].startswith("presence_") and str(ben.pk) in f["presences"]
    ]
    # One snapshot (offline, nothing else), and not a single diff.
    assert about_ben == [
        {
            "status": "offline",
            "last_seen": None,
            "devices": [],
            "text": None,
            "emoji": None,
            "activity": None,
        }
    ]
    assert "Secret plans" not in json.dumps(c.frames_received)


def test_idle_without_input_and_back_with_it(
    browser: Browser, daphne: Callable[..., Daphne], people: dict[str, Any]
) -> None:
    ann, ben = people["ann"], people["ben"]
    server = daphne({**LIVE, "IDLE_AFTER": 2})
    a = browser.open(ann, server.url)
    b = browser.open(ben, server.url)
    # No input on ben's page: idle after IDLE_AFTER, reported at once.
    expect(a.dot(ben)).to_have_class(IDLE, timeout=(2 + MARGIN) * 1000)
    expect(a.dot(ben)).to_have_attribute("title", "Idle")
    b.page.mouse.move(20, 20)
    b.page.mouse.move(40, 60)
    expect(a.dot(ben)).to_have_class(ONLINE, timeout=MARGIN * 1000)
    states = [f["state"] for f in b.frames_sent if f["type"] == "heartbeat"]
    assert "idle" in states
    assert states[-1] == "active" or "active" in states[states.index("idle") :]


def test_dots_added_and_removed_later_subscribe_and_unsubscribe(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    ann, ben, cy = people["ann"], people["ben"], people["cy"]
    a = browser.open(ann, live.url)
    a.wait_connected()
    browser.open(ben, live.url)
    expect(a.dot(ben)).to_have_class(ONLINE)
    first = [f for f in a.frames_sent if f["type"] == "subscribe"]
    assert all(str(cy.pk) not in f["users"] for f in first)  # only who the page shows

    # As a page would add a list of people: a dot and a last-seen text, no status known.
    a.page.evaluate(
        """(pk) => {
            const item = document.createElement("li");
            item.dataset.testid = "late";
            item.innerHTML = `<span class="presence-dot" data-presence-user="${pk}"
                data-testid="late-dot"></span><span data-presence-last-seen="${pk}"
                data-testid="late-text"></span>`;
            document.querySelector("main").append(item);
        }""",
        cy.pk,
    )
    expect(a.page.get_by_test_id("late-dot")).to_have_class(OFFLINE)  # what ann may see of cy
    expect(a.page.get_by_test_id("late-dot")).to_have_attribute("title", "Offline")
    # Ids are opaque strings to the client: sent as the page spells them.
    assert {"type": "subscribe", "users": [str(cy.pk)]} in a.frames_sent

    # Gone from the page: unsubscribed (ben, still shown, stays subscribed).
    unsubscribe = {"type": "unsubscribe", "users": [str(cy.pk)]}
    with a.sockets[-1].expect_event("framesent", lambda frame: json.loads(frame) == unsubscribe):
        a.page.get_by_test_id("late").evaluate("(el) => el.remove()")
    assert a.http_requests == []


def test_reconnects_and_resubscribes_after_a_server_restart(
    browser: Browser, daphne: Callable[..., Daphne], people: dict[str, Any]
) -> None:
    ann, ben = people["ann"], people["ben"]
    first = daphne(LIVE)
    a = browser.open(ann, first.url)
    a.wait_connected()
    # While the server is away, Chromium reports each refused connection on the console.
    a.allowed += [r"WebSocket connection to .* failed", r"ERR_CONNECTION_REFUSED"]

    first.stop()
    a.page.wait_for_function("() => window.presence.state !== 'open'")
    daphne(LIVE, port=first.port)  # back on the same address
    a.wait_connected(timeout=30_000)  # backoff with jitter: retries 0.5-1 s, 1-2 s, 2-4 s, ...
    states = a.page.evaluate("() => window.__presence.states")
    assert states[0] == "connecting" and states[-1] == "open"
    assert "closed" in states

    b = browser.open(ben, first.url)  # the resubscribed page learns of ben at once
    expect(a.dot(ben)).to_have_class(ONLINE)
    b.page.close()
    expect(a.dot(ben)).to_have_class(OFFLINE, timeout=(GRACE + 1 + MARGIN) * 1000)
    subscribes = [f for f in a.frames_sent if f["type"] == "subscribe"]
    assert len(subscribes) == 2 and all(str(ben.pk) in f["users"] for f in subscribes)


# --- polling fallback: no WebSocket in the page, live_server and the controlled clock ---------


@pytest.fixture
def grace(settings: Any) -> int:
    settings.PRESENCE = {"OFFLINE_GRACE": GRACE}
    return GRACE


def test_polling_a_friend_goes_online_and_offline_without_reload(
    browser: Browser, live_server: Any, people: dict[str, Any], clock: Any, grace: int
) -> None:
    ann, ben = people["ann"], people["ben"]
    a = browser.open(ann, live_server.url, websocket=False)
    expect(a.dot(ben)).to_have_class(OFFLINE)
    assert a.page.evaluate("() => window.presence.state") == "polling"
    a.page.evaluate("() => { window.loadedOnce = true; }")  # gone if the page reloads

    b = browser.open(ben, live_server.url, websocket=False)  # the login signal: ben online
    presences = a.refresh()
    assert presences[str(ben.pk)]["status"] == "online"
    expect(a.dot(ben)).to_have_class(ONLINE)
    expect(a.dot(ben)).to_have_attribute("title", "Online")
    expect(a.last_seen(ben)).to_have_text("online")

    b.log_out()
    # Logged out, ben stays online to others for the grace (a reload or a quick reconnect
    # must not flicker); the clock stands still, so this is exactly at the logout.
    assert a.refresh()[str(ben.pk)]["status"] == "online"
    # The store keeps the logout's second; the grace counts from that second's end, so ben is
    # online for the full grace whatever the fraction (docs/settings.md).
    clock.shift(grace + 0.5)
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


def test_without_an_asgi_server_the_client_says_once_why_it_polls(
    browser: Browser, live_server: Any, people: dict[str, Any]
) -> None:
    """Served by plain WSGI (pytest-django's live server), ws/presence/ answers 404: the page
    polls, and says why in the console once, however often it retries the socket."""
    a = browser.open(people["ann"], live_server.url, log_in=False)
    a.allowed += [r"WebSocket connection to .* failed"]  # Chromium's own report of the 404
    warnings: list[tuple[str, str]] = []  # (the page's URL, the text)
    a.page.on(
        "console",
        lambda m: warnings.append((a.page.url, m.text)) if m.type == "warning" else None,
    )
    a.log_in()
    home = a.page.url
    deadline = time.monotonic() + 15
    while len([w for w in a.sockets if w.url.endswith("/ws/presence/")]) < 4:
        assert time.monotonic() < deadline, "the page retries the socket"
        a.page.wait_for_timeout(200)
    told = [(url, text) for url, text in warnings if "could not be opened" in text]
    # Once per page (the login page, then the home page), however often it retried.
    assert [url for url, _ in told].count(home) == 1
    assert len(told) == len({url for url, _ in told})
    assert all("ASGI server" in text and "/ws/presence/" in text for _, text in told)
    assert a.page.evaluate("() => window.presence.state") in {"closed", "connecting"}


def test_polling_a_stranger_sees_an_online_user_offline_and_no_last_seen(
    browser: Browser, live_server: Any, people: dict[str, Any]
) -> None:
    ann, ben, cy = people["ann"], people["ben"], people["cy"]
    browser.open(ben, live_server.url, websocket=False)
    c = browser.open(cy, live_server.url, websocket=False)
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
    expect(c.last_seen(ben)).to_have_text("")

    # The same endpoint tells a friend that ben is online and since when: what cy got is
    # privacy, not missing data.
    a = browser.open(ann, live_server.url, websocket=False)
    seen_by_friend = a.refresh()[str(ben.pk)]
    assert seen_by_friend["status"] == "online"
    assert seen_by_friend["last_seen"]
    # Nowhere in cy's answer, but in cy's own presence (logged in the same second, maybe).
    others = {pk: p for pk, p in response.json()["presences"].items() if pk != str(cy.pk)}
    assert seen_by_friend["last_seen"] not in json.dumps(others)


def test_polling_dots_added_after_load_get_their_status_without_reload(
    browser: Browser, live_server: Any, people: dict[str, Any]
) -> None:
    ann, ben = people["ann"], people["ben"]
    a = browser.open(ann, live_server.url, websocket=False)
    expect(a.dot(ben)).to_have_class(OFFLINE)
    browser.open(ben, live_server.url, websocket=False)
    assert a.http_requests == []  # the first poll is 15 s away: nothing fetched yet

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
    assert len(a.http_requests) == 1
    assert parse_qs(urlsplit(a.http_requests[0]).query)["users"] == [str(ben.pk)]
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
    assert len(a.http_requests) == 1


def test_polling_status_menu_posts_without_a_socket(
    browser: Browser, live_server: Any, people: dict[str, Any]
) -> None:
    ann, ben = people["ann"], people["ben"]
    a = browser.open(ann, live_server.url, websocket=False)
    b = browser.open(ben, live_server.url, websocket=False)
    with b.page.expect_response(lambda r: urlsplit(r.url).path == STATUS_PATH) as answer:
        b.set_status("Do not disturb", text="Focus", expires="in 30 minutes")
    assert answer.value.status == 200
    assert answer.value.request.post_data_json == {
        "status": "dnd",
        "text": "Focus",
        "emoji": None,
        "expires_in": 1800,
    }
    expect(b.dot(ben)).to_have_class(DND)  # the page refreshed its dots after the change
    expect(b.page.locator("[data-status-summary]")).to_have_text("Focus")
    assert a.refresh()[str(ben.pk)]["status"] == "dnd"
    expect(a.dot(ben)).to_have_class(DND)


class ScriptedServer:
    """Plays the server's side of the pages' WebSockets, frame by frame, to reach the client's
    corner cases on purpose."""

    def __init__(self) -> None:
        self.sockets: list[Any] = []
        self.received: list[dict[str, Any]] = []

    def __call__(self, ws: Any) -> None:
        self.sockets.append(ws)
        ws.on_message(lambda message: self.received.append(json.loads(message)))

    def send(self, message: dict[str, Any]) -> None:
        self.sockets[-1].send(json.dumps(message))

    def wait_for(self, page: Any, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        # Playwright delivers the frames while it waits on the page.
        deadline = time.monotonic() + WAIT_MS / 1000
        while True:
            found = [frame for frame in self.received if predicate(frame)]
            if found:
                return found[-1]
            assert time.monotonic() < deadline, f"no such frame: {self.received}"
            page.wait_for_timeout(20)


def presence(status: str, **fields: Any) -> dict[str, Any]:
    base = {"last_seen": None, "devices": [], "text": None, "emoji": None, "activity": None}
    return {"status": status, **base, **fields}


def test_client_against_a_scripted_server(
    browser: Browser, live_server: Any, people: dict[str, Any]
) -> None:
    ann, ben = people["ann"], people["ben"]
    server = ScriptedServer()
    a = browser.open(ann, live_server.url, server=server)
    a.wait_connected()
    subscribe = server.wait_for(a.page, lambda f: f["type"] == "subscribe")
    assert str(ben.pk) in subscribe["users"]
    assert server.wait_for(a.page, lambda f: f["type"] == "heartbeat")["state"] == "active"

    # A diff that overtakes the snapshot of its user is kept, and wins over the snapshot.
    server.send({"type": "presence_diff", "presences": {str(ben.pk): presence("online")}})
    server.send({"type": "presence_state", "presences": {str(ben.pk): presence("offline")}})
    expect(a.dot(ben)).to_have_class(ONLINE)
    assert a.statuses_of(ben) == ["online"]
    # Diffs of users not subscribed are ignored.
    server.send({"type": "presence_diff", "presences": {"999999": presence("online")}})

    # Ids are opaque strings (UUID and string primary keys): subscribed as written on the page,
    # and their dots found again however odd the id (a quote and a backslash in a selector).
    odd = ["0B6F2C9E-3D4A-4F1E-9C2B-7A1D5E8F9A10", 'o"k\\1']
    a.page.evaluate(
        """(ids) => ids.forEach((id, i) => {
            const dot = document.createElement("span");
            dot.className = "presence-dot";
            dot.dataset.testid = `odd-${i}`;
            dot.setAttribute("data-presence-user", id);
            document.querySelector("main").append(dot);
        })""",
        odd,
    )
    assert server.wait_for(a.page, lambda f: f == {"type": "subscribe", "users": odd})
    server.send(
        {
            "type": "presence_state",
            "presences": {odd[0]: presence("online"), odd[1]: presence("idle")},
        }
    )
    expect(a.page.get_by_test_id("odd-0")).to_have_class(ONLINE)
    expect(a.page.get_by_test_id("odd-1")).to_have_class(IDLE)

    # setStatus: an error frame about subscriptions is not its answer; the next error is.
    settle = "() => { window.__settled = null; }"
    call = """(change) => { window.presence.setStatus(change).then(
        (p) => { window.__settled = ["ok", p.status]; },
        (e) => { window.__settled = ["error", e.code, e.message]; }); }"""
    a.page.evaluate(settle)
    a.page.evaluate(call, {"status": "dnd", "text": "x"})
    sent = server.wait_for(a.page, lambda f: f["type"] == "set_status")
    assert sent == {"type": "set_status", "status": "dnd", "text": "x"}
    server.send({"type": "error", "code": "unknown_users", "message": "No user 7", "users": [7]})
    server.send({"type": "error", "code": "invalid_value", "message": "Too long."})
    a.page.wait_for_function("() => window.__settled !== null")
    assert a.page.evaluate("() => window.__settled") == ["error", "invalid_value", "Too long."]

    a.page.evaluate(settle)
    a.page.evaluate(call, {"status": "dnd"})
    server.wait_for(a.page, lambda f: f == {"type": "set_status", "status": "dnd"})
    server.send({"type": "status", "presence": presence("dnd", invisible=False)})
    a.page.wait_for_function("() => window.__settled !== null")
    assert a.page.evaluate("() => window.__settled") == ["ok", "dnd"]
    assert a.http_requests == []

    # 4401 (logged out meanwhile): the client stops; it neither reconnects nor polls.
    connections = len(server.sockets)
    server.sockets[-1].close(code=4401, reason="not authenticated")
    a.page.wait_for_function("() => window.presence.state === 'unauthorized'")
    a.page.wait_for_timeout(1500)  # longer than the first retry would wait (0.5-1 s)
    assert len(server.sockets) == connections
    assert a.page.evaluate("() => window.presence.state") == "unauthorized"


def test_a_foreign_origin_close_stops_the_client(
    browser: Browser, live_server: Any, people: dict[str, Any]
) -> None:
    # 4403 (the page's origin is not allowed): every retry would be refused, so the client stops
    # as after 4401; it neither reconnects nor polls.
    server = ScriptedServer()
    a = browser.open(people["ann"], live_server.url, server=server)
    a.wait_connected()
    server.wait_for(a.page, lambda f: f["type"] == "subscribe")
    connections = len(server.sockets)
    server.sockets[-1].close(code=4403, reason="origin not allowed")
    a.page.wait_for_function("() => window.presence.state === 'forbidden'")
    a.page.wait_for_timeout(1500)  # longer than the first retry would wait (0.5-1 s)
    assert len(server.sockets) == connections
    assert a.http_requests == []
    assert a.page.evaluate("() => window.presence.state") == "forbidden"
