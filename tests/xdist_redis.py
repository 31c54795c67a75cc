"""A Redis server of its own for each pytest-xdist worker (loaded with ``-p tests.xdist_redis``).

The tests flush Redis around each test, and presence's pub/sub channel (the closes listener's)
is server-wide: two workers sharing one server would flush and hear each other. So a worker
starts the bundled redis-server on a free port as this plugin is imported (before Django's
settings read ``REDIS_URL``), points ``REDIS_URL`` at it (the daphne processes a test starts
inherit it) and stops it when the worker ends. Outside xdist, or on a Redis Cluster (which the
cluster variant shares between its tests, so it runs without ``-n``), it does nothing.
"""

from __future__ import annotations

import atexit
import os

import pytest

from tools.redis_server import RedisServer

_server: RedisServer | None = None

if os.environ.get("PYTEST_XDIST_WORKER"):
    if os.environ.get("REDIS_CLUSTER_URLS"):
        raise pytest.UsageError(
            "The cluster variant shares one Redis Cluster between its tests: run it without -n."
        )
    _server = RedisServer().start()
    # Stopped by its pid when the worker ends, also when it ends by an error.
    atexit.register(_server.__exit__)
    os.environ["REDIS_URL"] = _server.url


def pytest_unconfigure(config: pytest.Config) -> None:
    if _server is not None:
        _server.__exit__()
