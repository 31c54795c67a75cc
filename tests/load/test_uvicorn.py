"""The demo's ASGI application under uvicorn, the most used ASGI server, end to end as under
daphne (tests/load/test_multiprocess.py): a real uvicorn process on a free 127.0.0.1 port, real
WebSocket clients logged in by their session cookie, what one user's socket does pushed to a
friend's, and every process stopped by its pid, also when the test fails.

uvicorn differs from daphne where presence looks at the server: its send waits while the
client's transport is over its high-water mark (daphne's never waits), and it tells the bytes it
holds through its asyncio transport (presence.consumers.sending)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.daphne import Daphne
from tests.load.test_multiprocess import (
    TIMINGS,
    WAIT,
    Socket,
    bare_session_of,
    session_of,
)
from tests.load.test_multiprocess import friends as friends  # the fixture

pytest.importorskip("uvicorn", reason="pip install -e '.[dev]' (uvicorn[standard])")


class Uvicorn(Daphne):
    """``uvicorn siteproject.asgi:application`` with the daphne processes' settings and
    environment (tests.settings.daphne: the test database, REDIS_URL, PRESENCE)."""

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "siteproject.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--lifespan",
            "off",
            "--log-level",
            "warning",
        ]


@pytest.fixture
def uvicorn(transactional_db: Any) -> Iterator[Callable[..., Uvicorn]]:
    """Starts uvicorn processes: ``uvicorn(PRESENCE_dict)``; each is stopped (SIGTERM, then
    SIGKILL) at the end, whatever the test's outcome, before the database is flushed."""
    started: list[Uvicorn] = []

    def start(presence: dict[str, Any] | None = None) -> Uvicorn:
        server = Uvicorn(presence or {})
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
        server.log.close()


def test_a_session_under_uvicorn_from_connect_to_close(
    uvicorn: Callable[..., Uvicorn], friends: tuple[Any, Any]
) -> None:
    ann, ben = friends
    server = uvicorn(TIMINGS)
    assert server.process is not None and server.process.poll() is None
    viewer = Socket(server, session_of(ann), beat=False)
    user: Socket | None = None
    try:
        # Subscribe: the snapshot shows ben offline (no connection, no page view).
        viewer.send({"type": "subscribe", "users": [ben.pk]})
        snapshot = viewer.wait_for(lambda f: f["type"] == "presence_state")
        assert snapshot["presences"][str(ben.pk)]["status"] == "offline"

        # Ben connects (his session alone: no login request): ann is pushed a diff.
        user = Socket(server, bare_session_of(ben), beat=False)
        assert viewer.presence_of(ben, "online")["devices"] == ["web"]
        # His heartbeat says he is idle: pushed too, as one diff.
        user.send({"type": "heartbeat", "state": "idle"})
        viewer.presence_of(ben, "idle")
        diffs = [f for f in viewer.frames if str(ben.pk) in f.get("presences", {})]
        assert [f["type"] for f in diffs] == ["presence_state", "presence_diff", "presence_diff"]

        # Ben's own socket works both ways: his subscribe is answered with his own presence.
        user.send({"type": "subscribe", "users": [ben.pk, ann.pk]})
        mine = user.wait_for(lambda f: f["type"] == "presence_state")
        assert mine["presences"][str(ben.pk)]["status"] == "idle"
        assert mine["presences"][str(ann.pk)]["status"] == "online"

        # He closes his socket: offline for ann after OFFLINE_GRACE, with a last seen.
        user.close()
        user = None
        gone = viewer.presence_of(ben, "offline", timeout=TIMINGS["OFFLINE_GRACE"] + WAIT)
        assert gone["last_seen"] is not None
    finally:
        if user is not None:
            user.close()
        viewer.close()
    # The server is still up and serving after both sockets closed.
    assert server.process.poll() is None


def test_bad_input_and_refusals_under_uvicorn(
    uvicorn: Callable[..., Uvicorn], friends: tuple[Any, Any]
) -> None:
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    from tests.load.test_multiprocess import websockets_client

    ann, _ = friends
    server = uvicorn(TIMINGS)
    me = Socket(server, session_of(ann), beat=False)
    try:
        for message, code in [
            ("not json", "invalid_json"),
            ("[" * 5000 + "]" * 5000, "invalid_message"),
            ({"type": "heartbeat", "state": "x" * 70_000}, "frame_too_large"),
        ]:
            count = len(me.frames)
            me.send(message)
            assert me.wait_for(lambda f: f["type"] == "error", since=count)["code"] == code
        count = len(me.frames)
        me.send({"type": "subscribe", "users": [ann.pk]})
        assert me.wait_for(lambda f: f["type"] == "presence_state", since=count)
    finally:
        me.close()
    # Anonymous: accepted, then closed with 4401.
    anonymous = Socket(server, None, beat=False)
    try:
        with pytest.raises(ConnectionClosed) as refused:
            anonymous.wait_for(lambda f: False, timeout=WAIT)
        assert refused.value.rcvd is not None and refused.value.rcvd.code == 4401
    finally:
        anonymous.close()
    # Another site's page may not use ann's cookie: the origin check refuses the handshake.
    with pytest.raises(InvalidStatus) as foreign:
        websockets_client.connect(
            server.ws_url,
            origin="http://evil.example",
            additional_headers={"Cookie": f"sessionid={session_of(ann)}"},
            open_timeout=WAIT,
        )
    assert foreign.value.response.status_code == 403
