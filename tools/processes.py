"""Stopping the server processes the tools and tests start, and asking daphne if it serves."""

from __future__ import annotations

import http.client
import signal
import subprocess
from typing import Any


def stop_process(process: subprocess.Popen[Any] | None, timeout: float, kill: bool = False) -> None:
    """SIGTERM (SIGKILL with ``kill``: a crash), wait up to ``timeout`` seconds, then SIGKILL.
    Nothing if it is not running."""
    if process is None or process.poll() is not None:
        return
    if kill:
        process.kill()
    else:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def answers_http(port: int, path: str = "/login/") -> bool:
    """Whether a server on 127.0.0.1:``port`` answers ``GET path`` with 200."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit (128 + 15) in the main thread: a tool stopped by a timeout or a
    kill still stops what it started (its finally blocks run), as on Ctrl-C. Python's default
    ends the process at once, leaving its servers and clients running."""
    signal.signal(signal.SIGTERM, _exit)


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
