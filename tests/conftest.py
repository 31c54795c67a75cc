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
