"""The demo site and presence.js in a real browser, live: the WebSocket client against daphne.

The browser, the servers and the people: tests/browser/pages.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tests.browser.pages import DND, GRACE, IDLE, LIVE, MARGIN, OFFLINE, ONLINE, Browser, expect
from tests.browser.pages import browser as browser
from tests.browser.pages import chromium as chromium
from tests.browser.pages import live as live
from tests.browser.pages import people as people
from tests.daphne import Daphne, daphne_fixture  # noqa: F401 (the daphne fixture)

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
    assert any(str(ben.pk) in f["users"] for f in subscribes)
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
    expect(b.page.locator("[data-presence-status-summary]")).to_have_text("🎧 Focus")
    sent = [f for f in b.frames_sent if f["type"] == "set_status"]
    assert sent == [
        {
            "type": "set_status",
            "status": "dnd",
            "text": "Focus",
            "emoji": "🎧",
            "activity": None,
            "expires_in": 3600,
        }
    ]
    replies = [f for f in b.frames_received if f["type"] == "status"]
    assert replies[-1]["presence"]["status"] == "dnd"
    assert replies[-1]["presence"]["text"] == "Focus"
    assert b.http_requests == []  # over the socket, not the HTTP endpoint

    # The server refuses a text with an invisible control character (the input's maxlength
    # keeps a text over TEXT_MAX_LENGTH out); the menu shows its words; nothing changes.
    b.set_status("Automatic — online while you are active", text="x\u202ey")
    alert = b.status_menu.locator("[role=alert]")
    expect(alert).to_be_visible()
    expect(alert).to_contain_text("text")
    errors = [f for f in b.frames_received if f["type"] == "error"]
    assert errors[-1]["code"] == "invalid_value"
    expect(a.dot(ben)).to_have_class(DND)

    b.set_status("Automatic — online while you are active")
    expect(alert).to_be_hidden()
    expect(a.dot(ben)).to_have_class(ONLINE)
    expect(b.page.locator("[data-presence-status-summary]")).to_have_text("Set status")


def test_a_friends_custom_status_shows_changes_and_clears_without_reload(
    browser: Browser, live: Daphne, people: dict[str, Any]
) -> None:
    """{% presence_text %} on Home (templates/demo/_person.html): ben's custom status as the
    server rendered it, then as he changes it, clears it, and as it expires, the page never
    reloaded."""
    ann, ben = people["ann"], people["ben"]
    b = browser.open(ben, live.url)
    b.wait_connected()

    def set_status(change: dict[str, Any]) -> None:
        b.page.evaluate("(change) => window.presence.setStatus(change)", change)

    set_status({"status": "auto", "text": "Coffee", "emoji": "☕"})
    a = browser.open(ann, live.url)
    text = a.page.locator(f'.person .presence-text[data-presence-text="{ben.pk}"]').first
    expect(text).to_have_text("☕ Coffee")  # rendered by the server
    a.wait_connected()
    a.page.evaluate("() => { window.loadedOnce = true; }")

    set_status({"status": "dnd", "text": "<b>Lunch</b>", "emoji": "🍜"})
    expect(text).to_have_text("🍜 <b>Lunch</b>")
    expect(text.locator("b")).to_have_count(0)  # text, never markup
    set_status({"status": "auto"})
    expect(text).to_have_text("")
    expect(text).to_be_hidden()  # the demo shows no empty line

    set_at = time.monotonic()
    set_status({"status": "auto", "text": "Back soon", "expires_in": 2})
    expect(text).to_have_text("Back soon")
    expect(text).to_have_text("", timeout=(2 + 1 + MARGIN) * 1000)  # the sweep's diff
    elapsed = time.monotonic() - set_at
    assert elapsed >= 1, f"cleared after {elapsed:.2f} s, before its expiry"
    assert a.page.evaluate("() => window.loadedOnce") is True
    assert a.http_requests == []  # pushed, not polled


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
            "last_seen_approx": None,  # ben was never seen before
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


def test_an_idle_page_reconnects_idle(
    browser: Browser, daphne: Callable[..., Daphne], people: dict[str, Any]
) -> None:
    """A page idle when its socket drops opens the next one idle (``?state=idle``): its user
    is not shown online to every watcher in between."""
    ann, ben = people["ann"], people["ben"]
    first = daphne({**LIVE, "IDLE_AFTER": 2})
    b = browser.open(ben, first.url)
    b.wait_connected()
    assert "state=idle" not in b.sockets[-1].url
    a = browser.open(ann, first.url)
    expect(a.dot(ben)).to_have_class(IDLE, timeout=(2 + MARGIN) * 1000)
    for page in (a, b):
        page.allowed += [r"WebSocket connection to .* failed", r"ERR_CONNECTION_REFUSED"]

    first.stop()
    b.page.wait_for_function("() => window.presence.state !== 'open'")
    daphne({**LIVE, "IDLE_AFTER": 2}, port=first.port)
    b.wait_connected(timeout=30_000)
    assert "state=idle" in b.sockets[-1].url
    a.wait_connected(timeout=30_000)
    expect(a.dot(ben)).to_have_class(IDLE)


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
    # Ids are opaque strings to the client: sent as the page spells them. The page's own
    # markup carries no stamp: the full snapshot ("since": null; the answer brings a stamp).
    assert {"type": "subscribe", "users": [str(cy.pk)], "since": None} in a.frames_sent

    # Gone from the page: unsubscribed (ben, still shown, stays subscribed).
    unsubscribe = {"type": "unsubscribe", "users": [str(cy.pk)]}
    with a.sockets[-1].expect_event("framesent", lambda frame: json.loads(frame) == unsubscribe):
        a.page.get_by_test_id("late").evaluate("(el) => el.remove()")
    assert a.http_requests == []


def snapshotted(frame: dict[str, Any], user: Any) -> bool:
    """``frame`` (a presence_state) answers for ``user``: shown or left out as unchanged."""
    return str(user.pk) in {*frame["presences"], *map(str, frame.get("unchanged", []))}


def test_reconnects_and_resubscribes_after_a_server_restart(
    browser: Browser, daphne: Callable[..., Daphne], people: dict[str, Any]
) -> None:
    ann, ben = people["ann"], people["ben"]
    first = daphne(LIVE)
    a = browser.open(ann, first.url)
    a.wait_connected()
    # The first snapshot in hand (its stamp is what the reconnect resumes from): a server stopped
    # before its answer arrived leaves the page nothing to resume, a full snapshot again.
    a.wait_received(lambda f: f["type"] == "presence_state" and snapshotted(f, ben))
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
    subscribes = [
        f for f in a.frames_sent if f["type"] == "subscribe" and str(ben.pk) in f["users"]
    ]
    assert len(subscribes) == 2
    # The second connection resumes from the first one's snapshot: its stamp, never the page's
    # again (null, a full snapshot, where ben's element was drawn again meanwhile without a
    # stamp by the live friends list: seen once in four runs).
    assert subscribes[1]["since"] != subscribes[0]["since"]


def test_a_page_open_past_the_resume_window_resumes_from_its_fresh_stamp(
    browser: Browser, daphne: Callable[..., Daphne], people: dict[str, Any]
) -> None:
    """A page open longer than RESUME_WINDOW keeps the fresh stamps the server sends
    (docs/websocket.md, "Fresh stamps"), and its reconnect resumes from the last one: only what
    changed is sent, not the full snapshot its first answer's stamp (too old by then) gets."""
    ann, ben = people["ann"], people["ben"]
    # Fresh stamps every 8 s (half the window; W006 wants the window above 4 heartbeats + 4 s).
    first = daphne({**LIVE, "RESUME_WINDOW": 16})
    a = browser.open(ann, first.url)
    a.wait_connected()
    a.wait_received(lambda f: f["type"] == "presence_state" and snapshotted(f, ben))
    a.allowed += [r"WebSocket connection to .* failed", r"ERR_CONNECTION_REFUSED"]

    # Two fresh stamps: by the second, the first answer's stamp is past the window.
    for count in (1, 2):
        a.wait_received(
            lambda f, count=count: sum(g["type"] == "stamp" for g in a.frames_received) >= count,
            timeout=30_000,
        )
    fresh = [f["stamp"] for f in a.frames_received if f["type"] == "stamp"][-1]

    seen = len(a.frames_received)
    first.stop()
    a.page.wait_for_function("() => window.presence.state !== 'open'")
    daphne({**LIVE, "RESUME_WINDOW": 16}, port=first.port)
    a.wait_connected(timeout=30_000)

    subscribes = [
        f for f in a.frames_sent if f["type"] == "subscribe" and str(ben.pk) in f["users"]
    ]
    assert subscribes[-1]["since"] == fresh
    answer = a.wait_received(
        lambda f: (
            f in a.frames_received[seen:] and f["type"] == "presence_state" and snapshotted(f, ben)
        )
    )
    # Resumed: ben, unchanged, is left out (the full snapshot would carry him).
    assert str(ben.pk) in map(str, answer["unchanged"])
    assert str(ben.pk) not in answer["presences"]
