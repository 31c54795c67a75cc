"""Several real daphne processes sharing one Redis (and database), driven by a plain WebSocket
client (the ``websockets`` library): what one process records, a viewer on another sees pushed,
and a process killed with SIGKILL leaves its users offline within CONNECTION_TTL.

Also the protocol as a real server speaks it (frames, close codes), end to end through daphne,
the origin check and the session cookie.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from importlib import import_module
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.test import Client

from presence.models import Contact
from tests.daphne import Daphne, daphne_fixture  # noqa: F401 (the daphne fixture)

websockets_client = pytest.importorskip(
    "websockets.sync.client", reason="pip install -e '.[dev]' (websockets)"
)
from websockets.exceptions import ConnectionClosed, InvalidStatus  # noqa: E402

HEARTBEAT = 1
TTL = 2
GRACE = 1
SWEEP = 0.2
TIMINGS = {
    "HEARTBEAT_INTERVAL": HEARTBEAT,
    "CONNECTION_TTL": TTL,
    "OFFLINE_GRACE": GRACE,
    "SWEEP_INTERVAL": SWEEP,
}
MARGIN = 3.0  # seconds allowed past a deadline on a slow CI machine
WAIT = 10.0


class Socket:
    """A logged-in WebSocket connection that records every frame it receives, and optionally
    sends heartbeats every HEARTBEAT seconds from a thread (as presence.js does)."""

    def __init__(self, server: Daphne, session: str | None, *, beat: bool = True) -> None:
        headers = {"Cookie": f"sessionid={session}"} if session else {}
        self._exit = ExitStack()
        self.ws = self._exit.enter_context(
            websockets_client.connect(
                server.ws_url, origin=server.url, additional_headers=headers, open_timeout=WAIT
            )
        )
        self.frames: list[dict[str, Any]] = []
        self._stop = threading.Event()
        if beat:
            threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            try:
                self.send({"type": "heartbeat", "state": "active"})
            except ConnectionClosed:
                return

    def send(self, message: Any) -> None:
        self.ws.send(message if isinstance(message, str) else json.dumps(message))

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = WAIT, since: int = 0
    ) -> Any:
        """The first frame matching ``predicate``: recorded (from index ``since``) or to come."""
        for frame in self.frames[since:]:
            if predicate(frame):
                return frame
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no such frame within {timeout} s; got {self.frames}")
            try:
                frame = json.loads(self.ws.recv(timeout=left))
            except TimeoutError:
                continue
            self.frames.append(frame)
            if predicate(frame):
                return frame

    def presence_of(self, user: Any, status: str, timeout: float = WAIT) -> dict[str, Any]:
        """The next presence of ``user`` with ``status`` received from now on."""

        def about(frame: dict[str, Any]) -> bool:
            found = frame.get("presences", {}).get(str(user.pk))
            return bool(frame["type"].startswith("presence_") and found)

        frame = self.wait_for(
            lambda f: about(f) and f["presences"][str(user.pk)]["status"] == status,
            timeout,
            since=len(self.frames),
        )
        presence: dict[str, Any] = frame["presences"][str(user.pk)]
        return presence

    def close(self) -> None:
        self._stop.set()
        self._exit.close()


def session_of(user: Any) -> str:
    """A session cookie for ``user`` in the test database the servers read, logged in as a
    browser would be: the login signal records an authenticated request (HTTP presence)."""
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def bare_session_of(user: Any) -> str:
    """A session cookie for ``user`` made without logging in (no login signal, so no HTTP
    activity): the user's presence then comes from WebSocket connections alone."""
    engine = import_module(settings.SESSION_ENGINE)
    session = engine.SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return str(session.session_key)


@pytest.fixture
def friends(make_user: Callable[..., Any]) -> tuple[Any, Any]:
    ann, ben = make_user("ann"), make_user("ben")
    Contact.objects.create(owner=ann, contact=ben)
    Contact.objects.create(owner=ben, contact=ann)
    return ann, ben


def test_two_processes_share_presence_and_a_killed_one_leaves_users_offline(
    daphne: Callable[..., Daphne], friends: tuple[Any, Any]
) -> None:
    ann, ben = friends
    first, second = daphne(TIMINGS), daphne(TIMINGS)
    viewer = Socket(second, session_of(ann))
    viewer.send({"type": "subscribe", "users": [ben.pk]})
    snapshot = viewer.wait_for(lambda f: f["type"] == "presence_state")
    assert snapshot["presences"][str(ben.pk)]["status"] == "offline"

    cookie = bare_session_of(ben)
    started = time.monotonic()
    user = Socket(first, cookie)
    seen = viewer.presence_of(ben, "online")  # pushed by the second process
    pushed = time.monotonic() - started
    assert pushed < 1 + MARGIN, f"online pushed {pushed:.2f} s after connecting"
    assert seen["devices"] == ["web"]
    assert [f["type"] for f in viewer.frames if str(ben.pk) in f.get("presences", {})] == [
        "presence_state",
        "presence_diff",
    ]

    first.kill()  # no disconnect, no last seen, nothing runs: only the timestamps tell
    killed = time.monotonic()
    gone = viewer.presence_of(ben, "offline", timeout=TTL + GRACE + MARGIN + 5)
    after = time.monotonic() - killed
    # Not before the last heartbeat (at most HEARTBEAT before the kill) is a full CONNECTION_TTL
    # old (the store keeps its second, the TTL counts from that second's end); not much after.
    assert TTL - HEARTBEAT - 0.1 <= after <= TTL + GRACE + MARGIN, f"offline after {after:.2f} s"
    assert gone["last_seen"] is not None  # when ben was last heard from, shown to a friend
    user.close()
    viewer.close()


def test_a_user_who_logged_in_over_http_goes_offline_within_ttl_after_a_crash(
    daphne: Callable[..., Daphne], friends: tuple[Any, Any]
) -> None:
    """As in a browser: log in (an HTTP request), then the page connects; then its server
    process dies. The crash must count like a close: offline within CONNECTION_TTL."""
    ann, ben = friends
    first, second = daphne(TIMINGS), daphne(TIMINGS)
    viewer = Socket(second, session_of(ann))
    viewer.send({"type": "subscribe", "users": [ben.pk]})
    viewer.wait_for(lambda f: f["type"] == "presence_state")
    cookie = session_of(ben)
    # The store keeps whole seconds: connect in the next one, so that the login request comes
    # strictly before the connection (as it does in a browser, by a page load or more).
    time.sleep(1.05 - time.time() % 1)
    user = Socket(first, cookie)
    viewer.presence_of(ben, "online")  # the login already showed ben online: no news here
    # Frames are handled after the connect handler: an answer means the connection was
    # recorded. Killed before that, ben never had a connection and the login's window rules.
    user.send({"type": "subscribe", "users": []})
    user.wait_for(lambda f: f["type"] == "presence_state")
    first.kill()
    viewer.presence_of(ben, "offline", timeout=TTL + GRACE + MARGIN)
    user.close()
    viewer.close()


def test_protocol_through_a_real_server(
    daphne: Callable[..., Daphne], friends: tuple[Any, Any]
) -> None:
    ann, ben = friends
    server = daphne({**TIMINGS, "RATE_LIMIT": [30, 10]})
    me = Socket(server, session_of(ann), beat=False)

    me.send({"type": "set_status", "status": "dnd", "text": "Focus", "expires_in": 60})
    reply = me.wait_for(lambda f: f["type"] in ("status", "error"))
    assert reply["type"] == "status"
    assert reply["presence"]["status"] == "dnd"
    assert reply["presence"]["invisible"] is False
    # Self is not subscribed by itself; subscribing shows one's own true presence.
    me.send({"type": "subscribe", "users": [ann.pk, ben.pk]})
    state = me.wait_for(lambda f: f["type"] == "presence_state")
    assert set(state["presences"]) == {str(ann.pk), str(ben.pk)}
    assert state["presences"][str(ann.pk)]["text"] == "Focus"

    bad = [
        ("not json", "invalid_json"),
        ("[1, 2]", "invalid_message"),
        ({"type": "dance"}, "unknown_type"),
        ({"type": "subscribe", "users": "all"}, "invalid_message"),
        ({"type": "set_status", "status": "asleep"}, "invalid_value"),
        ({"type": "set_status", "status": "auto", "text": "x" * 1000}, "invalid_value"),
        ({"type": "set_status", "status": "auto", "expires_in": -5}, "invalid_value"),
        ({"type": "subscribe", "users": [10**9]}, "unknown_users"),
        ({"type": "heartbeat", "state": "x" * 70_000}, "frame_too_large"),
    ]
    for message, code in bad:
        count = len(me.frames)
        me.send(message)
        error = me.wait_for(lambda f: f["type"] == "error", since=count)
        assert error["code"] == code, message if isinstance(message, str) else str(message)[:80]
        assert error["message"]
    # Still open, nothing changed.
    count = len(me.frames)
    me.send({"type": "set_status", "status": "auto"})
    reply = me.wait_for(lambda f: f["type"] in ("status", "error"), since=count)
    assert reply["type"] == "status" and reply["presence"]["status"] == "online"
    assert me.frames[count:] == [reply]

    # Past RATE_LIMIT frames in its window: closed with 4429.
    with pytest.raises(ConnectionClosed) as closed:
        for _ in range(40):
            me.send({"type": "heartbeat", "state": "active"})
        me.wait_for(lambda f: False, timeout=WAIT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4429

    # Anonymous: accepted, then closed with 4401.
    anonymous = Socket(server, None, beat=False)
    with pytest.raises(ConnectionClosed) as refused:
        anonymous.wait_for(lambda f: False, timeout=WAIT)
    assert refused.value.rcvd is not None and refused.value.rcvd.code == 4401

    # Another site's page may not use ann's cookie: the origin check refuses the handshake.
    with pytest.raises(InvalidStatus) as foreign:
        websockets_client.connect(
            server.ws_url,
            origin="http://evil.example",
            additional_headers={"Cookie": f"sessionid={session_of(ann)}"},
            open_timeout=WAIT,
        )
    assert foreign.value.response.status_code == 403


def post_logout(server: Daphne, session: str) -> int:
    """POST /logout/ as a browser would (session and CSRF cookies, the CSRF header)."""
    import http.client

    token = "a" * 32  # any well-formed CSRF secret, sent as cookie and header alike
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT)
    try:
        conn.request(
            "POST",
            "/logout/",
            headers={
                "Cookie": f"sessionid={session}; csrftoken={token}",
                "X-CSRFToken": token,
                "Host": "127.0.0.1",
            },
        )
        return conn.getresponse().status
    finally:
        conn.close()


def test_logout_on_one_process_closes_that_sessions_socket_on_another(
    daphne: Callable[..., Daphne], friends: tuple[Any, Any]
) -> None:
    ann, _ = friends
    first, second = daphne(TIMINGS), daphne(TIMINGS)
    session, other_session = bare_session_of(ann), bare_session_of(ann)
    socket = Socket(first, session, beat=False)
    other = Socket(first, other_session, beat=False)
    for each in (socket, other):
        each.send({"type": "subscribe", "users": []})
        each.wait_for(lambda f: f["type"] == "presence_state")

    assert post_logout(second, session) == 302  # served by the other process
    with pytest.raises(ConnectionClosed) as closed:
        socket.wait_for(lambda f: False, timeout=WAIT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
    # The same user's other session keeps its socket.
    count = len(other.frames)
    other.send({"type": "subscribe", "users": [ann.pk]})
    state = other.wait_for(lambda f: f["type"] == "presence_state", since=count)
    assert state["presences"][str(ann.pk)]["status"] == "online"
    socket.close()
    other.close()


def test_a_password_change_closes_a_token_socket_on_a_server_process(
    daphne: Callable[..., Daphne], friends: tuple[Any, Any]
) -> None:
    # A native client's socket, opened with a token on a daphne process; the password changes
    # in another process (this one): the socket closes with 4401, the friend's stays open.
    from presence.tokens import issue_token

    ann, ben = friends
    server = daphne(TIMINGS)
    ws = websockets_client.connect(
        server.ws_url,
        additional_headers={"Authorization": f"Bearer {issue_token(ann)}"},
        open_timeout=WAIT,
    )
    friend = Socket(server, bare_session_of(ben), beat=False)
    try:
        ws.send(json.dumps({"type": "subscribe", "users": [ann.pk]}))
        assert json.loads(ws.recv(timeout=WAIT))["type"] == "presence_state"
        ann.set_password("a new secret")
        ann.save()
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=WAIT)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
        friend.send({"type": "subscribe", "users": [ann.pk]})
        friend.wait_for(lambda f: f["type"] == "presence_state")
    finally:
        ws.close()
        friend.close()
