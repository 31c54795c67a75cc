"""The demo site and presence.js in a real browser, polling: no WebSocket in the page,
``live_server`` and the controlled clock; and the client against a scripted server.

The browser, the servers and the people: tests/browser/pages.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.browser.pages import (
    API_PATH,
    DND,
    GRACE,
    IDLE,
    OFFLINE,
    ONLINE,
    STATUS_PATH,
    WAIT_MS,
    Browser,
    expect,
    opening_subscription,
    presence,
)
from tests.browser.pages import browser as browser
from tests.browser.pages import chromium as chromium
from tests.browser.pages import people as people
from tests.clock import T0
from tests.daphne import Daphne, daphne_fixture  # noqa: F401 (the daphne fixture)

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
    while len([w for w in a.sockets if urlsplit(w.url).path == "/ws/presence/"]) < 4:
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
        "activity": None,
        "expires_in": 1800,
    }
    expect(b.dot(ben)).to_have_class(DND)  # the page refreshed its dots after the change
    expect(b.page.locator("[data-presence-status-summary]")).to_have_text("Focus")
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
        # The subscription of the opening request, as the subscribe frame it stands for.
        if (subscription := opening_subscription(ws.url)) is not None:
            self.received.append(subscription)
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
    # Markup of the site's own carries no stamp: the client asks for the full snapshot.
    subscribe = {"type": "subscribe", "users": odd, "since": None}
    assert server.wait_for(a.page, lambda f: f == subscribe)
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


def test_a_page_read_before_a_fresh_room_state_is_dropped(
    browser: Browser, live_server: Any, people: dict[str, Any], settings: Any
) -> None:
    """A room_state that arrives while more() waits for a page (a reconnect, a recovery)
    replaces the list and its cursor; the page, which follows the old list, is not merged,
    so the fresh state's cursor pages on from its own list (none skipped)."""
    from presence.feed import api as feed

    settings.PRESENCE = {"ROOMS": {"post": "siteproject.demo.rooms.can_read_post"}}
    ann = people["ann"]
    post = feed.post(ann, "Paged")
    room = f"post:{post.pk}"
    server = ScriptedServer()
    a = browser.open(ann, live_server.url, server=server)
    a.page.goto(a.url("demo:post", post.pk))
    a.wait_connected()
    server.wait_for(a.page, lambda f: f == {"type": "join", "room": room, "meta": None})

    def member(name: str) -> dict[str, Any]:
        return {"meta": None, "presence": presence("online"), "card": {"name": name}}

    def state(cursor: str) -> dict[str, Any]:
        members = {str(ann.pk): member("Ann")}
        frame = {"type": "room_state", "room": room, "members": members, "others": 2}
        return {**frame, "count": 3, "next": cursor}

    server.send(state("first-cursor"))
    a.page.wait_for_function(f"() => window.presence.room({room!r})?.next === 'first-cursor'")
    a.page.evaluate(
        f"""() => {{ window.__page = null;
            window.presence.room({room!r}).more().then((page) => {{ window.__page = page; }}); }}"""
    )
    server.wait_for(
        a.page, lambda f: f == {"type": "room_more", "room": room, "after": "first-cursor"}
    )
    server.send(state("fresh-cursor"))
    # A more() of the fresh list while the old page is still on its way: asked for after it.
    a.page.wait_for_function(f"() => window.presence.room({room!r})?.next === 'fresh-cursor'")
    a.page.evaluate(
        f"""() => {{ window.__fresh = null; window.presence.room({room!r}).more()
            .then((page) => {{ window.__fresh = page; }}); }}"""
    )
    page = {"888881": member("Old Page")}
    frame = {"type": "room_page", "room": room, "members": page, "others": 1, "count": 3}
    server.send({**frame, "next": "old-chain"})
    a.page.wait_for_function("() => window.__page !== null")
    assert a.page.evaluate("() => window.__page") == {}
    # The fresh list's page is asked for from its own cursor, and merged.
    server.wait_for(
        a.page, lambda f: f == {"type": "room_more", "room": room, "after": "fresh-cursor"}
    )
    assert a.page.evaluate("() => window.__fresh") is None
    fresh = {"888882": member("Fresh Page")}
    server.send({**frame, "members": fresh, "next": None})
    a.page.wait_for_function("() => window.__fresh !== null")
    assert list(a.page.evaluate("() => window.__fresh")) == ["888882"]
    view = a.page.evaluate(f"() => window.presence.room({room!r})")
    assert view["next"] is None and list(view["members"]) == [str(ann.pk), "888882"]
