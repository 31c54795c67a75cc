"""The helpers and fixtures the store's tests share (tests/store/test_store.py,
tests/store/test_store_connections.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import override_settings

from presence import domain
from presence.conf import get_settings
from presence.store import KeyScheme, PresenceStore, get_store
from tests.conftest import cluster_urls

NOW = 1_800_000_000


@pytest.fixture
def store() -> PresenceStore:
    return get_store()


@pytest.fixture
def down_store(settings: object) -> Iterator[PresenceStore]:
    """A store pointed at a port where no Redis (or no cluster node) listens."""
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    presence = {"REDIS_CLUSTER": ["redis://127.0.0.1:1"]} if cluster_urls() else {}
    with override_settings(CACHES=caches, PRESENCE=presence):
        yield get_store()


def live(store: PresenceStore, user_id: Any) -> domain.LiveState:
    states = store.run(store.plans.read([user_id]))
    assert states is not None
    return states.get(user_id, domain.LiveState())


# --- for test_store_connections.py (live connections, schedules, merged plans) ----------------

# User 5's keys in this run's layout (one Redis, or the cluster run's shards).
KEYS = KeyScheme(get_settings())
SEEN = KEYS.seen_key(KEYS.bucket_of(5))


def entries(redis_client: redis.Redis, user_id: int = 5) -> set[str]:
    """The user's connections, "id:device_bit:idle:connected_at:heartbeat"."""
    return set(get_store().run(get_store().plans.describe_connections(user_id)))
