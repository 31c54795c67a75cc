"""Redis servers of its own for each pytest-xdist worker (loaded with ``-p tests.xdist_redis``).

The tests flush Redis around each test, and presence's pub/sub channel (the closes listener's)
is server-wide: two workers sharing one server would flush and hear each other. So a worker
starts the bundled redis-server on a free port as this plugin is imported (before Django's
settings read ``REDIS_URL``), points ``REDIS_URL`` at it (the daphne processes a test starts
inherit it) and stops it when the worker ends. In the cluster run (``REDIS_CLUSTER_URLS`` set,
``tools/redis_cluster.py``) a worker starts a three-master cluster of its own too, and the
channel layer's second shard (``REDIS_SHARD_URL``) when the run has one. Outside xdist it does
nothing.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

import pytest

from tools.redis_cluster import RedisCluster
from tools.redis_server import RedisServer

_started: list[Any] = []


def _start(server: Any) -> Any:
    _started.append(server)
    server.__enter__()
    return server


def _stop_all() -> None:
    # Each by its pid (tools.processes.stop_process), also when the worker ends by an error.
    while _started:
        _started.pop().__exit__(None, None, None)


if os.environ.get("PYTEST_XDIST_WORKER"):
    atexit.register(_stop_all)
    os.environ["REDIS_URL"] = _start(RedisServer()).url
    if os.environ.get("REDIS_CLUSTER_URLS"):
        os.environ["REDIS_CLUSTER_URLS"] = ",".join(_start(RedisCluster(masters=3)).urls)
        if os.environ.get("REDIS_SHARD_URL"):
            os.environ["REDIS_SHARD_URL"] = _start(RedisServer()).url


def pytest_unconfigure(config: pytest.Config) -> None:
    _stop_all()
