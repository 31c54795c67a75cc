"""presence.js's rules against scripted frames: the real script in headless Chromium, with a
stand-in WebSocket that the test drives frame by frame, a fetch that the test answers when it
wants, and the page's clock (Playwright's) moved by the test. No server and no Redis: what is
tested is how the script reconciles what reaches it out of order (a late HTTP answer, a frame
of a request it gave up on, a socket that closes under a pending request) and how long it
waits. Also the settings page's filter (presence/settings.js).

One Chromium for the module (tests/browser/pages.py's, skipped without it), a fresh context
and page per test. The end-to-end tests against daphne are the other test_browser_*.py.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from html import escape, unescape
from pathlib import Path
from typing import Any

import pytest
from django.test.utils import override_settings
from django.utils import translation

from presence import domain, rendering
from tests.browser.pages import CHROMIUM, CHROMIUM_ARGS, opening_subscription, presence
from tests.clock import T0, at

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]' (playwright)")

STATIC = Path(__file__).resolve().parents[2] / "presence" / "static" / "presence"
ORIGIN = "http://presence.test"
ENDPOINT = "/presence/api/presence"
COUNT_ENDPOINT = "/presence/api/online_count"
#: the page's clock stands still from here (a moment after T0, where it was installed: pausing
#: at T0 itself could be in its past already)
PAGE_START = at(60)

#: a WebSocket the test drives (window.__ws(): the latest; _open, _recv, _close) and a fetch
#: held until the test answers it (window.__fetches[i].answer(status, body)), or answered at
#: once by window.__answerFetch(url) -> [status, body] where the test set one
FAKES = r"""
(() => {
  window.__sockets = [];
  window.__fetches = [];
  class ScriptedSocket {
    constructor(url) {
      this.url = url; this.readyState = 0; this.sent = [];
      window.__sockets.push(this);
    }
    send(data) { this.sent.push(JSON.parse(data)); }
    close() {}
    _open() { this.readyState = 1; this.onopen && this.onopen({}); }
    _recv(frame) { this.onmessage && this.onmessage({data: JSON.stringify(frame)}); }
    _close(code) { this.readyState = 3; this.onclose && this.onclose({code}); }
  }
  Object.assign(ScriptedSocket, {CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3});
  window.WebSocket = ScriptedSocket;
  window.__ws = () => window.__sockets[window.__sockets.length - 1];
  window.fetch = (url, init) => new Promise((resolve, reject) => {
    const request = {
      url: String(url), at: Date.now(), body: init && init.body,
      answer(status, body) {
        resolve({ok: status >= 200 && status < 300, status, statusText: "",
                 json: async () => JSON.parse(JSON.stringify(body))});
      },
      fail() { reject(new TypeError("network")); },
    };
    window.__fetches.push(request);
    if (window.__answerFetch) request.answer(...window.__answerFetch(request.url));
  });
})();
"""

DOT = "<span class='presence-dot presence-dot--offline' data-presence-user='2'></span>"
ROOM = (
    "<div data-presence-room='doc:7'><ul data-presence-room-members></ul>"
    "<span data-presence-room-count>0</span></div>"
)


def member(name: str, status: str = "online") -> dict[str, Any]:
    return {"meta": None, "presence": presence(status), "card": {"name": name}}


def room_state(cursor: str | None, room: str = "doc:7") -> dict[str, Any]:
    return {
        "type": "room_state",
        "room": room,
        "members": {"1": member("Ann")},
        "others": 2,
        "count": 3,
        "next": cursor,
    }


def snapshot(
    presences: dict[str, dict[str, Any]], unchanged: list[str] | None = None, stamp: str = "S1"
) -> dict[str, Any]:
    return {
        "type": "presence_state",
        "presences": presences,
        "stamp": stamp,
        "unchanged": unchanged or [],
    }


class Client:
    """A page running presence.js; the page's time stands still until ``tick``."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("pageerror", lambda error: self.errors.append(str(error)))

    def js(self, expression: str, arg: Any = None) -> Any:
        return self.page.evaluate(expression, arg)

    def tick(self, ms: int) -> None:
        """Moves the page's clock, firing its timers on the way."""
        self.page.clock.run_for(ms)

    def open_socket(self) -> None:
        self.js("() => window.__ws()._open()")

    def close_socket(self, code: int) -> None:
        self.js("(code) => window.__ws()._close(code)", code)

    def receive(self, frame: dict[str, Any]) -> None:
        self.js("(frame) => window.__ws()._recv(frame)", frame)

    def sockets(self) -> int:
        result: int = self.js("() => window.__sockets.length")
        return result

    def sent(self, kind: str, every_socket: bool = False) -> list[dict[str, Any]]:
        """The frames of type ``kind`` sent on the latest socket (or on every one)."""
        result: list[dict[str, Any]] = self.js(
            "([kind, every]) => (every ? window.__sockets : [window.__ws()])"
            ".flatMap((s) => s.sent).filter((f) => f.type === kind)",
            [kind, every_socket],
        )
        return result

    def fetches(self, path: str = ENDPOINT) -> list[str]:
        result: list[str] = self.js(
            "(path) => window.__fetches.map((f) => f.url).filter((u) => u.startsWith(path))", path
        )
        return result

    def answer(self, url_start: str, body: dict[str, Any], nth: int = 0) -> None:
        """Answers (200) the ``nth`` pending request whose URL starts with ``url_start``."""
        self.js(
            """([start, nth, body]) => {
                const pending = window.__fetches.filter((f) => !f.done && f.url.startsWith(start));
                pending[nth].done = true;
                pending[nth].answer(200, body);
            }""",
            [url_start, nth, body],
        )

    def classes(self, selector: str) -> list[str]:
        result: list[str] = self.js(
            "(s) => Array.from(document.querySelectorAll(s)).map((el) => el.className)", selector
        )
        return result

    def add_element(self, html: str) -> None:
        self.js(
            "(html) => document.querySelector('main').insertAdjacentHTML('beforeend', html)", html
        )


@pytest.fixture(scope="module")
def chromium_browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Chromium not found at {CHROMIUM}: apt-get install chromium (CI installs it)")
    playwright = sync_api.sync_playwright().start()
    try:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()
    finally:
        playwright.stop()


@pytest.fixture
def client(chromium_browser: Any) -> Iterator[Callable[..., Client]]:
    """Opens a page of ``body`` with presence.js (its configuration as ``{% presence_script %}``
    renders it, with ``labels`` as its data-presence-labels); ``init`` runs before the script.
    No page may throw."""
    contexts: list[Any] = []
    clients: list[Client] = []

    def open_page(
        body: str, init: str = "", labels: dict[str, Any] | None = None, lang: str = "en"
    ) -> Client:
        context = chromium_browser.new_context()
        contexts.append(context)
        page = context.new_page()
        words = f" data-presence-labels='{escape(json.dumps(labels))}'" if labels else ""
        script = (
            "<script src='/static/presence.js' data-presence-socket='/ws/presence/'"
            f" data-presence-endpoint='{ENDPOINT}'"
            " data-presence-status-endpoint='/presence/api/status'"
            f" data-presence-heartbeat='30' data-presence-idle-after='300'{words}></script>"
        )
        html = f"<!doctype html><html lang='{lang}'><body><main>{body}</main>{script}</body></html>"
        page.route(
            f"{ORIGIN}/",
            lambda route: route.fulfill(body=html, content_type="text/html; charset=utf-8"),
        )
        page.route(
            f"{ORIGIN}/static/presence.js",
            lambda route: route.fulfill(
                body=(STATIC / "presence.js").read_text(), content_type="text/javascript"
            ),
        )
        page.add_init_script(FAKES + init)
        page.clock.install(time=T0)
        page.clock.pause_at(PAGE_START)
        page.goto(f"{ORIGIN}/")
        page.wait_for_function("() => window.presence && window.presence.refresh")
        opened = Client(page)
        clients.append(opened)
        return opened

    yield open_page
    for context in contexts:
        context.close()
    errors = [error for opened in clients for error in opened.errors]
    assert not errors, f"the page threw: {errors}"


# --- HTTP answers and the socket ----------------------------------------------------------------


def test_an_http_answer_read_before_the_socket_rendered_is_dropped(
    client: Callable[..., Client],
) -> None:
    c = client(DOT)
    c.open_socket()
    c.receive(snapshot({"2": presence("offline")}))
    c.close_socket(1006)  # a network drop: refresh() reads over HTTP meanwhile
    c.js("() => { window.__refresh = presence.refresh(); }")
    assert len(c.fetches()) == 1
    c.tick(1000)  # the first retry: within 1 s
    assert c.sockets() == 2
    c.open_socket()
    c.receive(snapshot({"2": presence("online")}, stamp="S2"))
    c.receive({"type": "presence_diff", "presences": {"2": presence("dnd")}})
    # The HTTP answer, read while user 2 was offline, arrives last.
    c.answer(ENDPOINT, {"presences": {"2": presence("offline")}})
    assert "presence-dot--dnd" in c.classes("[data-presence-user='2']")[0]
    # refresh() resolves to what is shown.
    assert c.js("() => window.__refresh")["2"]["status"] == "dnd"


def test_an_http_answer_overtaken_by_a_later_one_is_dropped(client: Callable[..., Client]) -> None:
    c = client(DOT)
    c.close_socket(1006)
    c.js("() => { presence.refresh(); }")
    c.js("() => { presence.refresh(); }")
    assert len(c.fetches()) == 2
    c.answer(ENDPOINT, {"presences": {"2": presence("idle")}}, nth=1)  # the later one first
    c.answer(ENDPOINT, {"presences": {"2": presence("online")}})
    assert "presence-dot--idle" in c.classes("[data-presence-user='2']")[0]


def test_http_answers_that_come_in_order_each_show(client: Callable[..., Client]) -> None:
    # The usual case: two reads overlap and are answered in the order they were made.
    c = client(DOT + f"<span data-presence-online-count='{COUNT_ENDPOINT}'>1</span>")
    c.close_socket(1006)
    c.js("() => { presence.refresh(); }")  # read while 2 is offline
    c.js("() => { window.__second = presence.refresh(); }")  # read once 2 came online
    assert len(c.fetches()) == 2
    c.answer(ENDPOINT, {"presences": {"2": presence("offline")}})
    c.answer(ENDPOINT, {"presences": {"2": presence("online")}})
    assert "presence-dot--online" in c.classes("[data-presence-user='2']")[0]
    assert c.js("() => window.__second")["2"]["status"] == "online"
    c.answer(COUNT_ENDPOINT, {"count": 3})
    c.answer(COUNT_ENDPOINT, {"count": 5})
    assert c.js("() => document.querySelector('[data-presence-online-count]').textContent") == "5"


def test_the_read_after_an_own_status_change_shows_it(client: Callable[..., Client]) -> None:
    c = client(DOT)
    c.close_socket(1006)
    c.js("() => { presence.refresh(); }")  # a poll in flight, read before the change
    c.js("() => { presence.setStatus({status: 'dnd'}); }")
    c.answer("/presence/api/status", {"presence": presence("dnd", invisible=False)})
    c.tick(10)
    assert len(c.fetches()) == 2  # the poll, and the read after the change
    c.answer(ENDPOINT, {"presences": {"2": presence("online")}})
    c.answer(ENDPOINT, {"presences": {"2": presence("dnd")}})
    assert "presence-dot--dnd" in c.classes("[data-presence-user='2']")[0]


def test_an_http_count_read_before_the_socket_count_is_dropped(
    client: Callable[..., Client],
) -> None:
    c = client(DOT + f"<span data-presence-online-count='{COUNT_ENDPOINT}'>1</span>")
    c.close_socket(1006)
    c.js("() => { presence.refresh(); }")  # a poll reads the count too
    c.tick(1000)
    c.open_socket()
    assert c.sent("watch_count")
    c.receive({"type": "online_count", "count": 7})
    c.answer(COUNT_ENDPOINT, {"count": 3})
    assert c.js("() => document.querySelector('[data-presence-online-count]').textContent") == "7"


def test_the_answer_of_an_unsubscribed_user_is_no_snapshot_of_the_next_subscription(
    client: Callable[..., Client],
) -> None:
    dot_of_9 = "<span id='u9' class='presence-dot' data-presence-user='9'></span>"
    c = client(DOT)
    c.open_socket()
    c.add_element(dot_of_9)
    c.tick(100)
    assert [f["users"] for f in c.sent("subscribe")] == [["9"]]
    c.js("() => document.getElementById('u9').remove()")
    c.tick(100)
    assert c.sent("unsubscribe")
    c.receive(snapshot({"9": presence("online")}))  # the first subscribe's answer, late
    c.add_element(dot_of_9)  # back on the page
    c.tick(100)
    assert len(c.sent("subscribe")) == 2
    # User 9 goes dnd while the second snapshot is read: the diff overtakes it and wins.
    c.receive({"type": "presence_diff", "presences": {"9": presence("dnd")}})
    c.receive(snapshot({"9": presence("online")}, stamp="S2"))
    assert "presence-dot--dnd" in c.classes("#u9")[0]


def test_refresh_while_open_includes_the_users_the_page_shows_unchanged(
    client: Callable[..., Client],
) -> None:
    c = client(
        "<span class='presence-dot presence-dot--online' data-presence-user='2'"
        " data-presence-since='P1'></span>"
        "<span class='presence-dot presence-dot--offline' data-presence-user='3'"
        " data-presence-since='P1'></span>"
    )
    c.open_socket()
    c.receive(snapshot({"3": presence("idle")}, unchanged=["2"]))
    c.js("() => { window.__shown = presence.refresh(); }")
    assert c.fetches() == [f"{ENDPOINT}?users=2"]  # only the user shown as rendered
    c.answer(ENDPOINT, {"presences": {"2": presence("online")}})
    shown = c.js("() => window.__shown")
    assert {id: p["status"] for id, p in shown.items()} == {"2": "online", "3": "idle"}
    # Read once: a second refresh() is answered from what is shown.
    assert set(c.js("() => presence.refresh()")) == {"2", "3"}
    assert len(c.fetches()) == 1


def test_refresh_while_open_asks_for_an_id_of_no_user_once(
    client: Callable[..., Client],
) -> None:
    # The endpoint leaves out ids of no user: asked once, not at every refresh().
    c = client(DOT.replace("'2'", "'999'"))
    c.open_socket()
    c.js("() => { window.__answerFetch = () => [200, {presences: {}}]; }")
    c.receive(snapshot({}))
    c.receive({"type": "error", "code": "unknown_users", "users": ["999"], "message": "No."})
    for _ in range(3):
        assert c.js("() => presence.refresh()") == {}
    assert len(c.fetches()) == 1


def test_failed_reads_while_open_do_not_put_off_polling(client: Callable[..., Client]) -> None:
    c = client(
        "<span class='presence-dot presence-dot--online' data-presence-user='2'"
        " data-presence-since='P1'></span>"
    )
    c.open_socket()
    c.receive(snapshot({}, unchanged=["2"]))
    for _ in range(3):  # refresh() reads the user shown unchanged; the endpoint fails (a 503)
        c.js("() => { presence.refresh(); }")
        c.js(
            "() => { const f = window.__fetches.filter((f) => !f.done).pop(); f.done = true;"
            " f.answer(503, {}); }"
        )
        c.tick(10)
    reads = len(c.fetches())
    c.close_socket(1006)
    c.js("() => { window.__answerFetch = () => [200, {presences: {}}]; }")
    c.tick(15_100)
    assert len(c.fetches()) == reads + 1  # polled 15 s after the close


@pytest.mark.parametrize("odd", ["a\rb", "a\fb", "a\x01b", "a\x7fb", 'q"\\ \n'])
def test_any_string_id_is_subscribed_and_rendered(client: Callable[..., Client], odd: str) -> None:
    c = client(DOT)
    c.open_socket()
    c.js(
        """(id) => { const dot = document.createElement('span'); dot.className = 'presence-dot';
           dot.setAttribute('data-presence-user', id);
           document.querySelector('main').append(dot); }""",
        odd,
    )
    c.tick(100)
    assert [f["users"] for f in c.sent("subscribe")] == [[odd]]
    c.receive(snapshot({"2": presence("online"), odd: presence("online")}))
    assert all("presence-dot--online" in cls for cls in c.classes(".presence-dot"))


# --- the texts the server renders, written again by the script -------------------------------


#: the page's moment: February 2025 has 28 days
TEXTS_AT = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
#: last seens at the edges of each unit, before TEXTS_AT
LAST_SEENS = [
    TEXTS_AT - timedelta(seconds=59),
    TEXTS_AT - timedelta(seconds=59.5),  # whole seconds: a minute (the JSON has no fraction)
    TEXTS_AT - timedelta(seconds=60),
    TEXTS_AT - timedelta(minutes=59, seconds=59),
    TEXTS_AT - timedelta(hours=1),
    TEXTS_AT - timedelta(days=1),
    TEXTS_AT - timedelta(days=7) + timedelta(seconds=1),
    TEXTS_AT - timedelta(days=7),
    datetime(2025, 2, 1, 12, 0, 1, tzinfo=UTC),  # 27 days: 3 weeks
    datetime(2025, 2, 1, 12, 0, tzinfo=UTC),  # a calendar month, 28 days
    datetime(2025, 1, 31, 12, 0, tzinfo=UTC),
    datetime(2025, 1, 30, 12, 0, tzinfo=UTC),
    datetime(2024, 3, 6, 12, 0, tzinfo=UTC),  # 360 days: 11 months
    datetime(2024, 3, 1, 12, 0, 1, tzinfo=UTC),
    datetime(2024, 3, 1, 12, 0, tzinfo=UTC),  # a calendar year, 365 days
    datetime(2024, 2, 29, 12, 0, tzinfo=UTC),
    datetime(2023, 3, 1, 12, 0, tzinfo=UTC),
    datetime(1901, 5, 1, tzinfo=UTC),  # 123 years
    datetime(1724, 3, 1, 12, 0, tzinfo=UTC),  # 301 years: words of 101
]


@pytest.mark.parametrize("language", ["en", "ja", "zh-hans", "vi", "de"])
def test_the_script_writes_the_last_seen_text_the_server_rendered(
    client: Callable[..., Client], language: str
) -> None:
    # One rule on both sides: for the same moment, the text presence.js writes is the one
    # {% last_seen %} rendered, and 30 s later the one it would render then.
    def server_texts(now: datetime) -> list[str]:
        with translation.override(language):
            return [domain.humanize(domain.Presence(last_seen=seen), now) for seen in LAST_SEENS]

    with translation.override(language):
        labels = rendering.script_labels()
    spans = "".join(f"<span data-presence-last-seen='{i}'></span>" for i in range(len(LAST_SEENS)))
    c = client(spans, labels=labels, lang=language)
    c.page.clock.set_system_time(TEXTS_AT)
    c.open_socket()
    presences = {
        str(i): presence("offline", last_seen=domain.iso_time(seen))
        for i, seen in enumerate(LAST_SEENS)
    }
    c.receive(snapshot(presences))
    written = (
        "() => Array.from(document.querySelectorAll('[data-presence-last-seen]'),"
        " (el) => el.textContent)"
    )
    assert c.js(written) == server_texts(TEXTS_AT)
    c.tick(30_000)  # the script's clock rewrites them
    assert c.js(written) == server_texts(TEXTS_AT + timedelta(seconds=30))


#: custom statuses as (emoji, text): both, either, none, and text that looks like markup
CUSTOM_STATUSES = [
    ("🎧", "Focus"),
    (None, "Lunch"),
    ("🌴", None),
    (None, None),
    ("'", '<img src="x" onerror="window.__pwned = 1">&amp;'),
    ("👩‍💻", "Tom & Jerry"),
]


def test_the_script_keeps_the_custom_status_as_the_server_renders_it(
    client: Callable[..., Client],
) -> None:
    # {% presence_text %}'s elements, stamped as the page's dots are: the page's users are
    # subscribed with that stamp, the text shown stays for users unchanged since, and each
    # diff's custom status is written as the tag would render it (text, never markup).
    def server_text(emoji: str | None, text: str | None) -> str:
        return rendering.custom_status(domain.Presence(text=text, emoji=emoji))

    stamp = "1741953600000.592f939f49105afc8bce"
    page = (
        str(rendering.dot_html(2, domain.Status.ONLINE, stamp))
        + str(rendering.status_text_html(2, server_text("🎧", "Focus"), stamp))
        + str(rendering.status_text_html(3, "", stamp))  # a text alone names its user too
    )
    c = client(page)
    assert opening_subscription(c.js("() => window.__ws().url")) == {
        "type": "subscribe",
        "users": ["2", "3"],
        "since": stamp,
    }
    c.open_socket()
    assert c.sent("subscribe") == []  # the opening request subscribed them
    c.receive(snapshot({}, unchanged=["2", "3"]))
    texts = "() => Array.from(document.querySelectorAll('.presence-text'), (el) => el.textContent)"
    assert c.js(texts) == ["🎧 Focus", ""]
    for emoji, text in CUSTOM_STATUSES:
        c.receive(
            {
                "type": "presence_diff",
                "presences": {
                    "2": presence("online", text=text, emoji=emoji),
                    "3": presence("offline", text=text, emoji=emoji),
                },
            }
        )
        assert c.js(texts) == [server_text(emoji, text)] * 2
    assert c.js("() => document.querySelectorAll('.presence-text *').length") == 0
    assert c.js("() => window.__pwned") is None
    # Polled too, and cleared (an expired status reads as none).
    c.close_socket(1006)
    c.js("() => { presence.refresh(); }")
    c.answer(ENDPOINT, {"presences": {"2": presence("online", text="Back", emoji=None)}})
    assert c.js(texts)[0] == "Back"
    c.js("() => { presence.refresh(); }")
    c.answer(ENDPOINT, {"presences": {"2": presence("online")}})
    assert c.js(texts)[0] == ""


#: (language, NUMBER_GROUPING of the site where the language has none)
NUMBER_FORMATS = [
    ("en", None),
    ("de", None),
    ("fr", None),  # a no-break space
    ("vi", None),  # no grouping
    ("zh-hans", None),  # groups of 4, no separator
    ("vi", (3, 2, 0)),  # as in India: 12.34.567
]
COUNTS = [0, 7, 999, 1000, 1234, 12345, 123456, 1234567, 1234567890]


@pytest.mark.parametrize(("language", "grouping"), NUMBER_FORMATS)
def test_the_script_writes_the_online_count_as_the_server_rendered_it(
    client: Callable[..., Client], language: str, grouping: Any
) -> None:
    with override_settings(NUMBER_GROUPING=grouping or 0), translation.override(language):
        labels = rendering.script_labels()
        rendered = [
            unescape(re.sub(r"<[^>]+>", "", rendering.online_count(count))) for count in COUNTS
        ]
    c = client(f"<span data-presence-online-count='{COUNT_ENDPOINT}'></span>", labels=labels)
    c.open_socket()
    written = []
    for count in COUNTS:
        c.receive({"type": "online_count", "count": count})
        written.append(
            c.js("() => document.querySelector('[data-presence-online-count]').textContent")
        )
    assert written == rendered


# --- the connection: waits and polling ------------------------------------------------------------


@pytest.mark.parametrize("code", [4429, 4408])
def test_the_tab_coming_back_keeps_the_wait_the_server_asked_for(
    client: Callable[..., Client], code: int
) -> None:
    c = client(DOT)
    c.open_socket()
    c.close_socket(code)
    c.tick(300)
    c.js("() => document.dispatchEvent(new Event('visibilitychange'))")
    c.js("() => window.dispatchEvent(new Event('online'))")
    c.tick(9_000)
    assert c.sockets() == 1  # still waiting
    c.tick(800)  # the retry: 10 s after the close (the first backoff is shorter)
    assert c.sockets() == 2


def test_the_tab_coming_back_reconnects_at_once_after_a_network_drop(
    client: Callable[..., Client],
) -> None:
    c = client(DOT)
    c.open_socket()
    c.tick(10_000)  # a connection that lasted: the backoff starts afresh
    c.close_socket(1006)
    c.js("() => document.dispatchEvent(new Event('visibilitychange'))")
    assert c.sockets() == 2


def test_failed_handshakes_do_not_put_off_polling(client: Callable[..., Client]) -> None:
    # Every handshake fails 20 ms after it was tried (no ASGI server: a 404, close 1006).
    refuse = """(() => { const Scripted = window.WebSocket;
      window.WebSocket = class extends Scripted {
        constructor(url) { super(url); setTimeout(() => this._close(1006), 20); } };
      Object.assign(window.WebSocket, {OPEN: 1}); })();"""
    c = client(DOT, init=refuse)
    c.js("() => { window.__answerFetch = () => [200, {presences: {}}]; }")
    c.tick(40_000)
    assert c.sockets() >= 5
    polled = c.js(
        f"() => window.__fetches.filter((f) => f.url.startsWith('{ENDPOINT}')).map((f) => f.at)"
    )
    start = int(PAGE_START.timestamp() * 1000)
    # Every 15 s from the first close.
    assert [round((at - start) / 1000) for at in polled] == [15, 30]


# --- set_status ----------------------------------------------------------------------------------


def test_a_rooms_error_never_answers_a_status_change(client: Callable[..., Client]) -> None:
    c = client(DOT + ROOM)
    c.open_socket()
    assert c.sent("join")
    c.js(
        """() => { window.__r = [];
        presence.setStatus({status: 'dnd'}).then((p) => __r.push(['ok1', p.status]),
                                                 (e) => __r.push(['err1', e.code])); }"""
    )
    c.receive({"type": "error", "code": "unavailable", "room": "doc:7", "message": "Down."})
    c.receive({"type": "status", "presence": presence("dnd", invisible=False)})
    c.js(
        """() => { presence.setStatus({status: 'auto'}).then((p) => __r.push(['ok2', p.status]),
                                                          (e) => __r.push(['err2', e.code])); }"""
    )
    c.receive({"type": "error", "code": "invalid_value", "room": "doc:8", "message": "Bad room."})
    c.receive({"type": "status", "presence": presence("online", invisible=False)})
    assert c.js("() => __r") == [["ok1", "dnd"], ["ok2", "online"]]


def test_a_refused_join_never_answers_a_status_change(client: Callable[..., Client]) -> None:
    # As the server answers: every error answering a join names its room.
    c = client(DOT + ROOM)
    c.open_socket()
    c.tick(100)
    c.receive(room_state(None))
    c.js(
        """() => { window.__r = []; presence.joinRoom('doc:7', {note: 'x'.repeat(600)});
        presence.setStatus({status: 'dnd'}).then((p) => __r.push(['ok', p.status]),
                                                 (e) => __r.push(['err', e.code])); }"""
    )
    assert c.sent("join")[-1]["meta"] == {"note": "x" * 600}
    c.receive({"type": "error", "code": "invalid_value", "room": "doc:7", "message": "Big."})
    c.receive({"type": "status", "presence": presence("dnd", invisible=False)})
    assert c.js("() => __r") == [["ok", "dnd"]]


def test_a_feeds_error_never_answers_a_status_change(client: Callable[..., Client]) -> None:
    # As the server answers: every error answering a watch_feed or unwatch_feed names its feed.
    c = client(DOT)
    c.open_socket()
    c.js(
        """() => { window.__r = []; window.__errors = [];
        presence.on('error', (e) => __errors.push(e));
        presence.watchFeed('user:abc');
        presence.setStatus({status: 'dnd', text: 'A'}).then((p) => __r.push(['ok1', p.text]),
                                                            (e) => __r.push(['err1', e.code]));
        presence.setStatus({status: 'dnd', text: 'B'}).then((p) => __r.push(['ok2', p.text]),
                                                            (e) => __r.push(['err2', e.code])); }"""
    )
    assert c.sent("watch_feed") == [{"type": "watch_feed", "feed": "user:abc"}]
    bad_name = "Unknown feed 'user:abc': use following, mentions, user:<id> or group:<slug>."
    c.receive({"type": "error", "code": "invalid_value", "message": bad_name, "feed": "user:abc"})
    c.receive({"type": "status", "presence": presence("dnd", text="A", invisible=False)})
    c.receive({"type": "status", "presence": presence("dnd", text="B", invisible=False)})
    assert c.js("() => __r") == [["ok1", "A"], ["ok2", "B"]]
    # The page is told, and which feed.
    assert c.js("() => __errors") == [
        {"code": "invalid_value", "message": bad_name, "feed": "user:abc"}
    ]


def test_an_unknown_type_never_answers_a_status_change(client: Callable[..., Client]) -> None:
    # A site without the activity feed answers watch_feed with unknown_type (naming no feed):
    # set_status is always a known type, so the error answers something else.
    c = client(DOT)
    c.open_socket()
    c.js(
        """() => { window.__r = []; presence.watchFeed('following');
        presence.setStatus({status: 'dnd'}).then((p) => __r.push(['ok', p.status]),
                                                 (e) => __r.push(['err', e.code])); }"""
    )
    c.receive({"type": "error", "code": "unknown_type", "message": "Unknown message type."})
    c.receive({"type": "status", "presence": presence("dnd", invisible=False)})
    assert c.js("() => __r") == [["ok", "dnd"]]
    # An error naming nothing still answers the status change it follows.
    c.js(
        """() => { presence.setStatus({status: 'dnd', emoji: 'x'.repeat(99)}).then(
            (p) => __r.push(['ok', p.status]), (e) => __r.push(['err', e.code])); }"""
    )
    c.receive({"type": "error", "code": "invalid_value", "message": "Too long."})
    assert c.js("() => __r") == [["ok", "dnd"], ["err", "invalid_value"]]


def test_an_error_naming_another_frame_never_answers_a_status_change(
    client: Callable[..., Client],
) -> None:
    # The server names the frame every error answers ("answers"): a subscribe of a malformed
    # id (a site's own markup with a bad data-presence-user) is refused with invalid_value, a
    # code a set_status could get too.
    c = client(DOT)
    c.open_socket()
    c.js(
        """() => { window.__r = []; window.__errors = [];
        presence.on('error', (e) => __errors.push(e.code));
        presence.setStatus({status: 'dnd'}).then((p) => __r.push(['ok1', p.status]),
                                                 (e) => __r.push(['err1', e.code])); }"""
    )
    c.add_element("<span data-presence-user='not-a-uuid'></span>")
    c.tick(1000)
    assert c.sent("subscribe")[-1]["users"] == ["not-a-uuid"]
    bad_id = "'not-a-uuid' is not a user id."
    c.receive({"type": "error", "code": "invalid_value", "message": bad_id, "answers": "subscribe"})
    c.receive({"type": "status", "presence": presence("dnd", invisible=False)})
    # One answering a set_status settles it, whatever its code.
    c.js(
        """() => { presence.setStatus({status: 'auto'}).then((p) => __r.push(['ok2', p.status]),
                                                          (e) => __r.push(['err2', e.code])); }"""
    )
    c.receive({"type": "error", "code": "unknown_users", "message": "No.", "answers": "set_status"})
    assert c.js("() => __r") == [["ok1", "dnd"], ["err2", "unknown_users"]]
    # The page is told of both.
    assert c.js("() => __errors") == ["invalid_value", "unknown_users"]


def test_the_late_answer_of_a_timed_out_change_settles_nothing_else(
    client: Callable[..., Client],
) -> None:
    c = client(DOT)
    c.open_socket()
    c.js(
        """() => { window.__r = [];
        presence.setStatus({status: 'dnd', text: 'Focus'}).then(
            (p) => __r.push(['ok1', p.status]), (e) => __r.push(['err1', e.code])); }"""
    )
    c.tick(10_000)
    assert c.js("() => __r") == [["err1", "timeout"]]
    c.js(
        """() => { presence.setStatus({status: 'auto', text: null}).then(
            (p) => __r.push(['ok2', p.status]), (e) => __r.push(['err2', e.code])); }"""
    )
    c.receive({"type": "status", "presence": presence("dnd", text="Focus", invisible=False)})
    assert c.js("() => __r") == [["err1", "timeout"]]
    c.receive({"type": "status", "presence": presence("online", invisible=False)})
    assert c.js("() => __r") == [["err1", "timeout"], ["ok2", "online"]]
    # A close sends again over HTTP the change still unanswered, not one that timed out.
    c.js("() => { presence.setStatus({status: 'dnd'}).catch(() => {}); }")
    c.tick(10_000)
    c.js("() => { presence.setStatus({status: 'auto'}).catch(() => {}); }")
    c.close_socket(1006)
    posted = c.js("() => window.__fetches.filter((f) => f.url === '/presence/api/status')")
    assert [json.loads(f["body"]) for f in posted] == [{"status": "auto"}]


# --- rooms ---------------------------------------------------------------------------------------


def test_a_join_refused_as_unavailable_is_joined_again_with_backoff(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM)
    c.open_socket()
    c.tick(100)
    assert len(c.sent("join")) == 1
    unavailable = {"type": "error", "code": "unavailable", "room": "doc:7", "message": "Down."}
    c.receive(unavailable)
    c.tick(1_000)  # the first retry: within 1 s
    assert len(c.sent("join")) == 2
    c.receive(unavailable)
    c.tick(999)
    assert len(c.sent("join")) == 2  # the second: 1 to 2 s later
    c.tick(1_001)
    assert len(c.sent("join")) == 3
    c.receive(room_state(None))
    assert c.js("() => presence.room('doc:7').count") == 3
    c.tick(60_000)
    assert len(c.sent("join")) == 3


def test_a_join_refused_for_good_is_not_joined_again_on_that_connection(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM)
    c.open_socket()
    c.tick(100)
    c.receive({"type": "error", "code": "forbidden", "room": "doc:7", "message": "No."})
    c.add_element("<div data-presence-room='doc:8'></div>")  # the rooms are looked at again
    c.tick(60_000)
    assert [f["room"] for f in c.sent("join")] == ["doc:7", "doc:8"]
    assert not c.sent("leave")  # never in doc:7: nothing to leave


def test_a_room_refused_as_too_many_is_joined_once_the_page_leaves_one(
    client: Callable[..., Client],
) -> None:
    c = client("<div id='first' data-presence-room='doc:1'></div>" + ROOM)
    c.open_socket()
    c.tick(100)
    c.receive({"type": "error", "code": "too_many_rooms", "room": "doc:7", "message": "Full."})
    c.tick(60_000)
    assert [f["room"] for f in c.sent("join")] == ["doc:1", "doc:7"]
    c.js("() => document.getElementById('first').remove()")
    c.tick(200)
    assert [f["room"] for f in c.sent("leave")] == ["doc:1"]
    assert [f["room"] for f in c.sent("join")] == ["doc:1", "doc:7", "doc:7"]


def test_a_join_that_failed_on_the_server_is_joined_again_with_backoff(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM)
    c.open_socket()
    c.tick(100)
    c.receive({"type": "error", "code": "internal_error", "room": "doc:7", "message": "Bug."})
    c.tick(1_000)
    assert len(c.sent("join")) == 2
    c.receive(room_state(None))
    c.tick(60_000)
    assert len(c.sent("join")) == 2


@pytest.mark.parametrize("code", ["invalid_value", "unavailable", "forbidden"])
def test_the_late_answer_of_a_page_given_up_on_is_no_answer_to_a_join(
    client: Callable[..., Client], code: str
) -> None:
    c = client(ROOM)
    c.open_socket()
    c.tick(100)
    c.receive(room_state("c1"))
    c.js("() => { presence.room('doc:7').more().catch(() => {}); }")
    c.tick(10_000)  # more() gave up
    c.receive({"type": "error", "code": code, "room": "doc:7", "message": "Late."})
    c.tick(60_000)
    assert len(c.sent("join")) == 1  # not joined again, as after a refused join
    c.receive(
        {
            "type": "room_diff",
            "room": "doc:7",
            "joins": {"6": member("Fay")},
            "leaves": [],
            "others": 2,
            "count": 4,
        }
    )
    assert c.js("() => presence.room('doc:7').count") == 4  # still in the room
    c.js("() => document.querySelector('[data-presence-room]').remove()")
    c.tick(200)
    assert c.sent("leave") == [{"type": "leave", "room": "doc:7"}]


def test_a_paged_members_live_dot_is_kept_when_the_room_changes(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM)
    c.open_socket()
    c.tick(100)
    c.receive({**room_state("c1"), "others": 1, "count": 2})
    c.js("() => { presence.room('doc:7').more(); }")
    assert c.sent("room_more")
    c.receive(
        {
            "type": "room_page",
            "room": "doc:7",
            "members": {"5": member("Eve")},
            "others": 1,
            "count": 2,
            "next": None,
        }
    )
    c.tick(100)  # the members' dots are subscribed
    assert any("5" in f["users"] for f in c.sent("subscribe"))
    c.receive(snapshot({"5": presence("online")}))
    c.receive({"type": "presence_diff", "presences": {"5": presence("dnd")}})
    # Someone else arrives: the room is shown again.
    c.receive(
        {
            "type": "room_diff",
            "room": "doc:7",
            "joins": {"6": member("Fay")},
            "leaves": [],
            "others": 1,
            "count": 3,
        }
    )
    assert "presence-dot--dnd" in c.classes("[data-presence-room-member='5'] .presence-dot")[0]
    assert c.js("() => presence.room('doc:7').members['5'].presence.status") == "dnd"


def test_a_page_asked_over_a_socket_that_closed_resolves_empty(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM)
    c.open_socket()
    c.tick(100)
    c.receive(room_state("c1"))
    c.js(
        """() => { window.__r = []; presence.room('doc:7').more().then(
            (p) => __r.push(['first', p]), (e) => __r.push(['first', e.code])); }"""
    )
    assert c.sent("room_more")
    c.close_socket(1006)
    assert c.js("() => __r") == [["first", {}]]  # at once, unmerged
    c.tick(1_000)
    c.open_socket()
    c.tick(100)
    c.receive(room_state("c2"))
    c.js(
        """() => { presence.room('doc:7').more().then(
            (p) => __r.push(['second', p]), (e) => __r.push(['second', e.code])); }"""
    )
    assert c.sent("room_more") == [{"type": "room_more", "room": "doc:7", "after": "c2"}]
    c.tick(9_000)
    assert c.js("() => __r") == [["first", {}]]  # no timer of the first page left


# --- the settings page's filter (presence/settings.js) ------------------------------------------


def test_the_settings_filter_matches_what_the_server_search_matches(
    chromium_browser: Any,
) -> None:
    # As presence/templates/presence/settings.html renders a contact "jsmith" named John Smith.
    html = (
        "<input type='search' id='q' data-presence-filter='people'><div id='people'>"
        "<fieldset data-presence-person='John Smith'"
        " data-presence-person-search='jsmith&#10;John&#10;Smith'><legend>John Smith</legend>"
        "</fieldset><fieldset data-presence-person='ann' data-presence-person-search='ann'>"
        "<legend>ann</legend></fieldset>"
        "<p data-presence-filter-empty hidden>None of the people listed matches.</p></div>"
        f"<script>{(STATIC / 'settings.js').read_text()}</script>"
    )
    context = chromium_browser.new_context()
    try:
        page = context.new_page()
        page.set_content(html)
        shown = "() => Array.from(document.querySelectorAll('fieldset')).map((f) => !f.hidden)"
        empty = "() => !document.querySelector('[data-presence-filter-empty]').hidden"
        for typed, expected in [
            ("JSMI", [True, False]),  # the username, any case
            ("john smith", [True, False]),  # the name shown
            ("mith", [True, False]),
            ("an", [False, True]),
            ("jsmith ann", [False, False]),
        ]:
            page.fill("#q", typed)
            assert page.evaluate(shown) == expected, typed
            assert page.evaluate(empty) is (expected == [False, False]), typed
    finally:
        context.close()


def test_an_activity_that_comes_again_is_shown_once(client: Callable[..., Client]) -> None:
    # An announcement sent again after a channel-layer failure may have landed the first time
    # too: the activity comes twice, and only the timelines it was not shown for are told.
    c = client(DOT)
    c.open_socket()
    c.js(
        """() => { window.__shown = [];
        presence.on('activity', ({feeds, activity}) => __shown.push([feeds, activity.id]));
        presence.watchFeed('following'); presence.watchFeed('mentions'); }"""
    )
    activity = {"id": 7, "text": "hi"}
    c.receive({"type": "activity", "feeds": ["following"], "activity": activity})
    c.receive({"type": "activity", "feeds": ["following"], "activity": activity})
    c.receive({"type": "activity", "feeds": ["following", "mentions"], "activity": activity})
    c.receive({"type": "activity", "feeds": ["following"], "activity": {"id": 8}})
    assert c.js("() => __shown") == [[["following"], 7], [["mentions"], 7], [["following"], 8]]


# --- rooms' counts ({% room_count %}) ------------------------------------------------------------

COUNTS_ENDPOINT = "/presence/api/room_counts"


def counts(*rooms: tuple[str, int]) -> str:
    """The markup {% room_count %} renders for each (room, count)."""
    return "".join(f"{rendering.room_count((room, n))} here;" for room, n in rooms)


def count_of(c: Client, room: str) -> list[str]:
    result: list[str] = c.js(
        "(room) => Array.from(document.querySelectorAll(`[data-presence-room-count-of='${room}']`))"
        ".map((el) => el.textContent)",
        room,
    )
    return result


def test_room_counts_are_watched_over_the_socket_not_joined(
    client: Callable[..., Client],
) -> None:
    c = client(counts(("topic:1", 3), ("topic:2", 0), ("topic:1", 3)))
    c.js("() => { window.__counts = []; presence.on('room_count', (d) => __counts.push(d)); }")
    c.open_socket()
    assert c.sent("watch_room_count") == [
        {"type": "watch_room_count", "room": "topic:1"},
        {"type": "watch_room_count", "room": "topic:2"},
    ]
    assert not c.sent("join")  # the viewer is in no room: not "here now", no MAX_ROOMS place
    c.receive({"type": "room_count", "room": "topic:1", "count": 1234})
    assert count_of(c, "topic:1") == ["1,234", "1,234"]
    assert count_of(c, "topic:2") == ["0"]
    assert c.js("() => __counts") == [{"room": "topic:1", "count": 1234}]
    # After a reconnect the counts are watched again.
    c.tick(10_000)
    c.close_socket(1006)
    c.tick(60_000)
    c.open_socket()
    assert [f["room"] for f in c.sent("watch_room_count")] == ["topic:1", "topic:2"]
    # A room's last element leaving the page: unwatched (and a new one watched).
    c.js("() => document.querySelectorAll(`[data-presence-room-count-of='topic:2']`)[0].remove()")
    c.add_element(counts(("topic:3", 0)))
    c.tick(100)
    assert c.sent("unwatch_room_count") == [{"type": "unwatch_room_count", "room": "topic:2"}]
    assert c.sent("watch_room_count")[-1] == {"type": "watch_room_count", "room": "topic:3"}


def test_without_a_socket_the_counts_are_polled_in_one_request(
    client: Callable[..., Client],
) -> None:
    c = client(counts(("topic:1", 3), ("page:/a b", 0)))
    c.close_socket(1006)
    c.js("() => { presence.refresh(); }")  # a poll reads the counts too
    assert c.fetches(COUNTS_ENDPOINT) == [f"{COUNTS_ENDPOINT}?room=topic%3A1&room=page%3A%2Fa%20b"]
    c.answer(COUNTS_ENDPOINT, {"counts": {"topic:1": 5, "page:/a b": 2}})
    assert count_of(c, "topic:1") == ["5"] and count_of(c, "page:/a b") == ["2"]
    # A read that started before the socket's count arrived does not undo it.
    c.js("() => { presence.refresh(); }")
    c.tick(60_000)
    c.open_socket()
    c.receive({"type": "room_count", "room": "topic:1", "count": 7})
    c.answer(COUNTS_ENDPOINT, {"counts": {"topic:1": 4, "page:/a b": 2}})
    assert count_of(c, "topic:1") == ["7"]


def test_a_polled_count_the_viewer_may_no_longer_see_shows_nothing_the_others_go_on(
    client: Callable[..., Client],
) -> None:
    """The endpoint answers a room the viewer may no longer see (its rule, a kind no longer
    declared) as null, as the tag renders nothing for it: its element shows nothing, and the
    page's other counts keep being polled and shown."""
    c = client(counts(("topic:1", 3), ("club:1", 2)))
    c.js("() => { window.__counts = []; presence.on('room_count', (d) => __counts.push(d)); }")
    c.close_socket(1006)
    c.js("() => { presence.refresh(); }")
    c.answer(COUNTS_ENDPOINT, {"counts": {"topic:1": 5, "club:1": None}})
    assert count_of(c, "topic:1") == ["5"] and count_of(c, "club:1") == [""]
    assert c.js("() => __counts") == [{"room": "topic:1", "count": 5}]
    c.js("() => { presence.refresh(); }")
    c.answer(COUNTS_ENDPOINT, {"counts": {"topic:1": 6, "club:1": None}})
    assert count_of(c, "topic:1") == ["6"] and count_of(c, "club:1") == [""]
    # Let in again: shown again.
    c.js("() => { presence.refresh(); }")
    c.answer(COUNTS_ENDPOINT, {"counts": {"topic:1": 6, "club:1": 1}})
    assert count_of(c, "club:1") == ["1"]


def test_polled_counts_go_by_the_rendered_room_list_limit(client: Callable[..., Client]) -> None:
    """Each request names at most the endpoint's ROOM_LIST_LIMIT rooms, as the tag rendered it
    (else every poll of a page with more counts than a lowered limit answered too_many_rooms)."""
    rooms = [(f"topic:{n}", 0) for n in range(30)]
    with override_settings(PRESENCE={"ROOM_LIST_LIMIT": 20}):
        c = client(counts(*rooms))
    c.close_socket(1006)
    c.js("() => { presence.refresh(); }")
    asked = [url.count("room=") for url in c.fetches(COUNTS_ENDPOINT)]
    assert asked == [20, 10]


def test_a_too_many_rooms_answer_splits_the_polled_counts(client: Callable[..., Client]) -> None:
    """A limit lowered since the page rendered: the request answered too_many_rooms is asked
    again in halves at once, and later polls ask as many rooms a request."""
    c = client(counts(*[(f"topic:{n}", 0) for n in range(30)]))
    c.close_socket(1006)
    c.js("() => { presence.refresh(); }")
    assert [url.count("room=") for url in c.fetches(COUNTS_ENDPOINT)] == [30]
    too_many = {"error": {"code": "too_many_rooms", "message": "At most 20 rooms."}}
    c.js(
        """(body) => {
            const pending = window.__fetches.filter((f) => !f.done);
            pending[0].done = true;
            pending[0].answer(400, body);
        }""",
        too_many,
    )
    c.tick(0)
    halves = c.fetches(COUNTS_ENDPOINT)[1:]
    assert [url.count("room=") for url in halves] == [15, 15]
    c.answer(COUNTS_ENDPOINT, {"counts": {"topic:0": 4}})
    assert count_of(c, "topic:0") == ["4"]
    c.js("() => { presence.refresh(); }")
    assert [url.count("room=") for url in c.fetches(COUNTS_ENDPOINT)[3:]] == [15, 15]


def test_a_refused_count_is_not_watched_again_and_answers_nothing_else(
    client: Callable[..., Client],
) -> None:
    c = client(ROOM + counts(("topic:1", 3), ("topic:2", 0)))
    c.open_socket()
    c.tick(100)
    c.js(
        """() => { window.__r = [];
        presence.setStatus({status: 'dnd'}).then((p) => __r.push(['ok', p.status]),
                                                 (e) => __r.push(['err', e.code])); }"""
    )
    c.receive(
        {
            "type": "error",
            "code": "forbidden",
            "room": "topic:1",
            "answers": "watch_room_count",
            "message": "No.",
        }
    )
    c.receive({"type": "status", "presence": presence("dnd", invisible=False)})
    assert c.js("() => __r") == [["ok", "dnd"]]
    # Unavailable: watched again with backoff; the refused one is not, nor is the room left.
    c.receive(
        {
            "type": "error",
            "code": "unavailable",
            "room": "topic:2",
            "answers": "watch_room_count",
            "message": "Down.",
        }
    )
    c.add_element(counts(("topic:1", 3)))  # the page is looked at again
    c.tick(1_000)
    assert [f["room"] for f in c.sent("watch_room_count")] == ["topic:1", "topic:2", "topic:2"]
    assert [f["room"] for f in c.sent("join")] == ["doc:7"] and not c.sent("leave")
    # The room of {% room_presence %} is joined as before; its refusal is the join's.
    c.receive({"type": "error", "code": "forbidden", "room": "doc:7", "message": "No."})
    c.tick(60_000)
    assert len(c.sent("watch_room_count")) == 3


@pytest.mark.parametrize(
    ("code", "answers", "shown"),
    [
        # Unprompted: the room's rule asked again (recheck_room, a heartbeat) refuses the viewer.
        ("forbidden", None, ""),
        ("forbidden", "watch_room_count", ""),
        ("unknown_room", "watch_room_count", ""),  # a kind no longer declared
        ("too_many_watched_rooms", "watch_room_count", "4"),  # right, only no longer live
    ],
)
def test_a_count_refused_over_the_socket_shows_nothing_as_a_null_poll_does(
    client: Callable[..., Client], code: str, answers: str | None, shown: str
) -> None:
    """A room the viewer may no longer see shows nothing, as the poll's null count and the tag
    do (its old number stayed), until a connection counts it again; the other counts go on."""
    c = client(counts(("topic:1", 3), ("topic:2", 5)))
    c.open_socket()
    c.receive({"type": "room_count", "room": "topic:1", "count": 4})
    error = {"type": "error", "code": code, "room": "topic:1", "message": "No."}
    c.receive(error if answers is None else {**error, "answers": answers})
    assert count_of(c, "topic:1") == [shown]
    assert count_of(c, "topic:2") == ["5"]
    c.tick(10_000)
    c.close_socket(1006)
    c.tick(60_000)
    c.open_socket()
    assert [f["room"] for f in c.sent("watch_room_count")] == ["topic:1", "topic:2"]
    c.receive({"type": "room_count", "room": "topic:1", "count": 2})
    assert count_of(c, "topic:1") == ["2"]


def count_unavailable(c: Client, room: str) -> None:
    c.receive(
        {
            "type": "error",
            "code": "unavailable",
            "room": room,
            "answers": "watch_room_count",
            "message": "Down.",
        }
    )


def count_watches(c: Client) -> int:
    return len(c.sent("watch_room_count"))


def count_refused_five_times(c: Client) -> None:
    """Redis down: topic:1's watch answered unavailable five times, each retry let through."""
    c.open_socket()
    assert count_watches(c) == 1
    for n in range(5):
        count_unavailable(c, "topic:1")
        c.tick(31_000)  # past any backoff (at most RETRY_MAX_MS)
        assert count_watches(c) == n + 2


def test_a_count_counted_again_starts_a_later_outages_backoff_afresh(
    client: Callable[..., Client],
) -> None:
    """As a room's join does: the count's tries end with its room_count, so a brief outage an
    hour later is watched again within a second, not after 15-30 s."""
    c = client(counts(("topic:1", 3)))
    count_refused_five_times(c)
    c.receive({"type": "room_count", "room": "topic:1", "count": 4})  # Redis back
    c.tick(3_600_000)
    count_unavailable(c, "topic:1")
    c.tick(1_000)
    assert count_watches(c) == 7


def test_a_new_connection_watches_a_count_waiting_for_its_retry_at_once(
    client: Callable[..., Client],
) -> None:
    """As a room's join again: the retry timer of the closed connection does not hold the
    count's watch on the next one."""
    c = client(counts(("topic:1", 3)))
    count_refused_five_times(c)
    count_unavailable(c, "topic:1")  # the 6th: 15-30 s
    c.tick(10_000)
    c.close_socket(1006)
    c.tick(2_000)
    assert c.sockets() == 2
    c.open_socket()
    assert [f["room"] for f in c.sent("watch_room_count")] == ["topic:1"]
    # The old timer firing later watches nothing twice.
    c.tick(31_000)
    assert [f["room"] for f in c.sent("watch_room_count")] == ["topic:1"]


def test_a_timeline_is_watched_again_from_the_newest_activity_shown(
    client: Callable[..., Client],
) -> None:
    # What is posted while the socket is down (or before the watch is answered) is sent as
    # the answer of a watch_feed naming the newest activity the page shows ("after").
    c = client(DOT)
    c.js(
        """() => { window.__shown = []; window.__reloads = [];
        presence.on('activity', ({feeds, activity}) => __shown.push([feeds, activity.id]));
        presence.on('feed_reload', ({feed}) => __reloads.push(feed));
        presence.watchFeed('following', {after: 5}); presence.watchFeed('mentions'); }"""
    )
    c.open_socket()
    assert c.sent("watch_feed") == [
        {"type": "watch_feed", "feed": "following", "after": 5},
        {"type": "watch_feed", "feed": "mentions"},
    ]
    c.receive({"type": "activity", "feeds": ["following"], "activity": {"id": 7}})
    c.receive(
        {
            "type": "missed_activities",
            "feed": "following",
            "activities": [{"id": 6}, {"id": 7}],
            "reload": False,
        }
    )
    assert c.js("() => __shown") == [[["following"], 7], [["following"], 6]]
    c.tick(10_000)
    c.close_socket(1006)
    c.tick(60_000)
    c.open_socket()
    assert c.sent("watch_feed") == [
        {"type": "watch_feed", "feed": "following", "after": 7},
        {"type": "watch_feed", "feed": "mentions"},
    ]
    c.receive({"type": "missed_activities", "feed": "following", "activities": [], "reload": True})
    assert c.js("() => __reloads") == ["following"]
    c.js("() => presence.unwatchFeed('following')")
    c.receive({"type": "missed_activities", "feed": "following", "activities": [{"id": 9}]})
    assert len(c.js("() => __shown")) == 2  # a late answer for a timeline no longer watched


def test_a_timelines_after_waits_for_the_answer_of_its_watch(
    client: Callable[..., Client],
) -> None:
    # An activity posted while the server reads the answer (6..8) comes live first: the
    # timeline's "after" moves past it only with that answer, or a socket that drops before
    # it comes would ask from 9 and 6..8 would never be shown.
    c = client(DOT)
    c.js(
        """() => { window.__shown = [];
        presence.on('activity', ({activity}) => __shown.push(activity.id));
        presence.watchFeed('following', {after: 5}); }"""
    )
    c.open_socket()
    c.receive({"type": "activity", "feeds": ["following"], "activity": {"id": 9}})
    c.tick(10_000)
    c.close_socket(1006)  # the answer never arrives
    c.tick(60_000)
    c.open_socket()
    assert c.sent("watch_feed") == [{"type": "watch_feed", "feed": "following", "after": 5}]
    c.receive({"type": "activity", "feeds": ["following"], "activity": {"id": 10}})
    c.receive(
        {
            "type": "missed_activities",
            "feed": "following",
            "activities": [{"id": 6}, {"id": 7}, {"id": 8}, {"id": 9}],
            "reload": False,
        }
    )
    assert c.js("() => __shown") == [9, 10, 6, 7, 8]  # 9, shown already, once
    # Answered: the live activities shown meanwhile count from now on, and so do later ones.
    c.receive({"type": "activity", "feeds": ["following"], "activity": {"id": 11}})
    c.tick(10_000)
    c.close_socket(1006)
    c.tick(60_000)
    c.open_socket()
    assert c.sent("watch_feed") == [{"type": "watch_feed", "feed": "following", "after": 11}]
