from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth import get_user_model

from presence import store as store_module
from presence.conf import get_settings
from presence.middleware import throttle


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("REDIS_URL"):
        raise pytest.UsageError(
            "REDIS_URL is not set. Run `make test` (it starts a throwaway redis-server), or "
            "`python -m tools.redis_server -- pytest`, or set REDIS_URL to a Redis whose "
            "database the tests may flush."
        )


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ["REDIS_URL"]


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _clean_presence_state(redis_url: str) -> Iterator[None]:
    """Each test starts with an empty Redis database, fresh settings and no throttle memory."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()
    get_settings.cache_clear()
    store_module.reset_clients()
    throttle.clear()
    yield
    store_module.reset_clients()
    throttle.clear()


_usernames = itertools.count()


@pytest.fixture
def make_user(db: Any) -> Callable[..., Any]:
    def make(username: str | None = None, **fields: Any) -> Any:
        name = username or f"user{next(_usernames)}"
        return get_user_model().objects.create_user(username=name, password="pw", **fields)

    return make


# --- Fixtures for the middleware, signals and presence_cleanup tests --------------------------
# (imports are local so this section can be appended without touching the header above)


class RedisCommandCounter:
    """Counts the commands the real Redis server executed, from ``INFO commandstats`` deltas.

    Server-side counting needs no client instrumentation; the counter's own INFO calls are
    left out. One command in a delta also means one round trip.
    """

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def snapshot(self) -> dict[str, int]:
        stats = self.client.info("commandstats")
        return {
            name.removeprefix("cmdstat_"): int(values["calls"])
            for name, values in stats.items()
            if name != "cmdstat_info"
        }

    def delta(self, before: dict[str, int]) -> dict[str, int]:
        after = self.snapshot()
        return {
            name: calls - before.get(name, 0)
            for name, calls in after.items()
            if calls != before.get(name, 0)
        }


@pytest.fixture
def redis_commands(redis_client: redis.Redis) -> RedisCommandCounter:
    return RedisCommandCounter(redis_client)


@pytest.fixture
def private_redis(settings: Any) -> Iterator[Any]:
    """A second, private redis-server that a test may stop and start again (outage tests).

    The default cache (and so presence) points at it; presence rebuilds its clients on
    ``setting_changed``.
    """
    from tools.redis_server import RedisServer

    with RedisServer() as server:
        caches = {alias: dict(conf) for alias, conf in settings.CACHES.items()}
        caches["default"]["LOCATION"] = server.url
        settings.CACHES = caches
        yield server


# --- Language hygiene for the template tag, JSON endpoint and admin tests ---------------------


@pytest.fixture(autouse=True)
def _reset_language() -> Iterator[None]:
    """A request with Accept-Language activates its language in the test's thread (Django's
    LocaleMiddleware does not undo it); start the next test in the default language again."""
    yield
    from django.utils import translation

    translation.deactivate()


@pytest.fixture
async def close_async_db_connections() -> Any:
    """For async tests using the database: close the connection Django opened in the
    sync_to_async worker thread, so the test database can be flushed and dropped."""
    yield
    from asgiref.sync import sync_to_async
    from django.db import connections

    await sync_to_async(connections.close_all)()


@pytest.fixture
def clock() -> Iterator[Any]:
    """Time stands still at tests.clock.T0 until the test shifts it."""
    import time_machine

    from tests.clock import T0

    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller
