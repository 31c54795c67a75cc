"""Large answers and clients that never read, through a real daphne (tests/daphne.py).

A raw socket with a tiny receive buffer does the WebSocket handshake by hand and then only
sends, never reads: the server's unsent bytes for it must stay bounded (MAX_UNSENT_BYTES) and the
connection be dropped, while the process goes on serving others. And an answer larger than
daphne's largest message (1 MiB) arrives whole, in several frames.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.daphne import Daphne, daphne_fixture  # noqa: F401 (the daphne fixture)
from tests.live.test_sending import LONG, heavy_targets
from tests.load.test_multiprocess import bare_session_of

websockets_client = pytest.importorskip(
    "websockets.sync.client", reason="pip install -e '.[dev]' (websockets)"
)

WAIT = 15.0
#: the cap these tests run with: small, so that a few answers pass it
CAP = 256 * 1024


def rss_kib(pid: int) -> int:
    """The process's resident memory, in KiB (/proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


class RawSocket:
    """A WebSocket client by hand over a plain socket with a 4 KB receive buffer; after the
    handshake it only sends (masked text frames), never reads."""

    def __init__(self, server: Daphne, session: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(WAIT)
        self.sock.connect(("127.0.0.1", server.port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                "GET /ws/presence/ HTTP/1.1\r\n"
                f"Host: 127.0.0.1:{server.port}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Origin: {server.url}\r\nCookie: sessionid={session}\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 4096:
            chunk = self.sock.recv(1)
            if not chunk:
                raise AssertionError(f"handshake refused: {head!r}")
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head
        # From here on nothing is read: the server's frames pile up.
        self.sock.settimeout(1.0)

    def send(self, message: dict[str, Any]) -> None:
        payload = json.dumps(message).encode()
        mask = os.urandom(4)
        length = len(payload)
        if length < 126:
            header = struct.pack("!BB", 0x81, 0x80 | length)
        elif length < 65536:
            header = struct.pack("!BBH", 0x81, 0x80 | 126, length)
        else:
            header = struct.pack("!BBQ", 0x81, 0x80 | 127, length)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def crowd(make_user: Callable[..., Any]) -> tuple[Any, list[Any]]:
    viewer = make_user("reader")
    return viewer, heavy_targets(viewer, 600)  # ~1.15 MB of presences


def test_a_client_that_never_reads_is_dropped_and_memory_stays_bounded(
    daphne: Callable[..., Daphne], crowd: tuple[Any, list[Any]]
) -> None:
    viewer, targets = crowd
    server = daphne({"MAX_UNSENT_BYTES": CAP, "RATE_LIMIT": [10_000, 10]})
    assert server.process is not None
    pid = server.process.pid
    session = bare_session_of(viewer)
    ids = [t.pk for t in targets[:200]]  # ~390 KB an answer: under daphne's 1 MiB message
    raw = RawSocket(server, session)
    try:
        before = rss_kib(pid)
        dropped = False
        deadline = time.monotonic() + WAIT
        # Bounded by count and time: a subscribe and an unsubscribe every 20 ms (~20 MB/s of
        # answers for the server to hold) until the server drops the socket.
        for _ in range(2000):
            if time.monotonic() > deadline:
                break
            try:
                raw.send({"type": "subscribe", "users": ids})
                raw.send({"type": "unsubscribe", "users": ids})
            except OSError:  # reset or broken pipe: the server dropped the connection
                dropped = True
                break
            time.sleep(0.02)
        grown = rss_kib(pid) - before
        took = WAIT - (deadline - time.monotonic())
        print(f"dropped={dropped} after {took:.1f} s; daphne RSS grew by {grown} KiB")  # -s
        assert dropped, f"not dropped within {WAIT} s; daphne grew by {grown} KiB"
        # The cap plus a frame in daphne's buffer, and the kernel's (not in RSS); far from the
        # hundreds of MB an unbounded buffer reaches.
        assert grown < 40 * 1024, grown
    finally:
        raw.close()
    # The process still serves others.
    with websockets_client.connect(
        server.ws_url,
        origin=server.url,
        additional_headers={"Cookie": f"sessionid={session}"},
        open_timeout=WAIT,
    ) as ws:
        ws.send(json.dumps({"type": "subscribe", "users": ids[:3]}))
        frame = json.loads(ws.recv(timeout=WAIT))
        assert frame["type"] == "presence_state" and len(frame["presences"]) == 3


def test_an_answer_over_daphnes_message_limit_arrives_whole_in_several_frames(
    daphne: Callable[..., Daphne], crowd: tuple[Any, list[Any]]
) -> None:
    viewer, targets = crowd
    server = daphne({})
    ids = {str(t.pk) for t in targets}
    with websockets_client.connect(
        server.ws_url,
        origin=server.url,
        additional_headers={"Cookie": f"sessionid={bare_session_of(viewer)}"},
        open_timeout=WAIT,
        max_size=None,
    ) as ws:
        ws.send(json.dumps({"type": "subscribe", "users": [t.pk for t in targets]}))
        got: dict[str, Any] = {}
        frames = 0
        deadline = time.monotonic() + WAIT
        while set(got) != ids:
            left = deadline - time.monotonic()
            assert left > 0, f"{len(got)} of {len(ids)} presences within {WAIT} s"
            try:
                frame = json.loads(ws.recv(timeout=left))
            except TimeoutError:
                continue
            assert frame["type"] == "presence_state", frame
            assert not set(frame["presences"]) & set(got)  # each user once
            got.update(frame["presences"])
            frames += 1
        assert frames >= 2
        assert {p["text"] for p in got.values()} == {LONG}
