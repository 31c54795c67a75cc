"""Real daphne processes serving the demo (``siteproject.asgi``) for the live tests.

A test module uses the ``daphne`` fixture with ``from tests.daphne import daphne_fixture``.

Each process runs ``daphne -b 127.0.0.1 -p PORT siteproject.asgi:application`` with
``tests.settings.daphne``: the test database this process created (committed rows only, so tests
using it are ``transaction=True``), the same ``REDIS_URL``, ``PRESENCE`` passed as JSON, and
optionally the channel layer's hosts (several: channels_redis shards over them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tools.processes import answers_http, stop_process
from tools.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent
DAPHNE = Path(sys.executable).parent / "daphne"
START_TIMEOUT = 30.0


class Daphne:
    #: what it serves, with which settings (tests/sites/test_forumsite_browser.py serves the forum)
    APPLICATION = "siteproject.asgi:application"
    SETTINGS_MODULE = "tests.settings.daphne"
    READY_PATH = "/login/"  # answers 200 once the server is up

    def __init__(
        self,
        presence: dict[str, Any],
        port: int | None = None,
        layer_hosts: list[str] | None = None,
    ) -> None:
        self.presence = presence
        #: the channel layer's servers (default: REDIS_URL alone)
        self.layer_hosts = layer_hosts
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="presence-daphne-", suffix=".log")  # noqa: SIM115

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/presence/"

    def command(self) -> list[str]:
        """The server's command line (tests/load/test_uvicorn.py serves with another server)."""
        port = str(self.port)
        return [str(DAPHNE), "-b", "127.0.0.1", "-p", port, self.APPLICATION]

    def environment(self) -> dict[str, str]:
        """What the process's settings read besides the test database and PRESENCE."""
        return {}

    def start(self) -> Daphne:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": self.SETTINGS_MODULE,
            "PRESENCE_TEST_DATABASE": str(connection.settings_dict["NAME"]),
            "PRESENCE_TEST_SETTINGS": json.dumps(self.presence),
            "PRESENCE_TEST_LAYER_HOSTS": json.dumps(self.layer_hosts or []),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            **self.environment(),
        }
        self.process = subprocess.Popen(
            self.command(),
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.command()[0]} exited with {self.process.returncode}:\n{self.output()}"
                )
            if answers_http(self.port, self.READY_PATH):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"daphne did not answer on port {self.port}:\n{self.output()}")

    def stop(self) -> None:
        """A clean shutdown (SIGTERM): open connections are closed and disconnect runs."""
        stop_process(self.process, timeout=10)

    def kill(self) -> None:
        """A crash: SIGKILL, nothing runs on the way out."""
        stop_process(self.process, timeout=10, kill=True)

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-5000:]


@pytest.fixture(name="daphne")
def daphne_fixture(transactional_db: Any) -> Iterator[Callable[..., Daphne]]:
    """Starts daphne processes: ``daphne(PRESENCE_dict, port=None)``; all stop at the end,
    before the database is flushed."""
    started: list[Daphne] = []

    def start(
        presence: dict[str, Any] | None = None,
        port: int | None = None,
        layer_hosts: list[str] | None = None,
    ) -> Daphne:
        server = Daphne(presence or {}, port, layer_hosts)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
        server.log.close()
