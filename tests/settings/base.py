"""Settings for the test suite: the demo site's settings (the demo is tested too), with a real
Redis from REDIS_URL (tests/conftest.py insists on it) and SQLite, or DATABASE_URL."""

from __future__ import annotations

import os

import dj_database_url

from siteproject.settings import *  # noqa: F403
from siteproject.settings import BASE_DIR, INSTALLED_APPS

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]

# Daphne only replaces runserver; the tests have no use for it.
# tests.sites.graphsite: a site's own follow model kept in sync with presence (docs/api.md).
INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "daphne"] + ["tests.sites.graphsite"]

DATABASES = {"default": dj_database_url.config(default=f"sqlite:///{BASE_DIR / 'test.sqlite3'}")}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tests capture presence's log records themselves (caplog); keep Django's defaults quiet.
LOGGING_CONFIG = None

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The test database in a file rather than in memory, so that the daphne processes of the live
    # tests (tests/daphne.py) open the very database this process created. One per test run, in
    # /dev/shm (memory) where there is one.
    import tempfile

    _dir = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    DATABASES["default"]["TEST"] = {"NAME": os.path.join(_dir, f"presence-test-{os.getpid()}.db")}
    # As the demo's (presence.W005): the live tests' daphne processes write beside this one.
    # But DEFERRED: pytest-django holds a transaction open around a test, and an IMMEDIATE one
    # would hold the write lock against the test's other threads (sync_to_async, the database
    # thread) for the whole test. So these settings do not pass presence.W005, on purpose: it is
    # silenced for `manage.py check` (its tests set the options they need).
    DATABASES["default"]["OPTIONS"] = {
        **SQLITE_OPTIONS,  # noqa: F405
        "transaction_mode": "DEFERRED",
    }
    SILENCED_SYSTEM_CHECKS = ["presence.W005"]

# The tests start from presence's defaults (the demo links mentions to its profiles).
PRESENCE = {}
PRESENCE_FEED = {}

# The cluster run (`make test` runs the store, API, middleware, consumer, hub and cleanup tests a
# second time this way): presence's state on a three-master Redis Cluster (tools/redis_cluster.py)
# and the channel layer sharded over two plain Redis servers (channels_redis shards by itself).
# tests/conftest.py makes every PRESENCE a test sets point at the cluster.
TEST_REDIS_CLUSTER = [url for url in os.environ.get("REDIS_CLUSTER_URLS", "").split(",") if url]
if TEST_REDIS_CLUSTER:
    PRESENCE = {"REDIS_CLUSTER": TEST_REDIS_CLUSTER}
    if os.environ.get("REDIS_SHARD_URL"):
        CHANNEL_LAYERS = {
            "default": {
                **CHANNEL_LAYERS["default"],  # noqa: F405
                "CONFIG": {
                    **CHANNEL_LAYERS["default"]["CONFIG"],  # type: ignore[dict-item]  # noqa: F405
                    "hosts": [os.environ["REDIS_URL"], os.environ["REDIS_SHARD_URL"]],
                },
            }
        }

# The channel layer of channels_redis's pub/sub flavour (PRESENCE_TEST_LAYER=pubsub): `make test`
# runs the hub and consumer tests on it too (docs/deployment.md compares the two).
if os.environ.get("PRESENCE_TEST_LAYER") == "pubsub":
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]},  # type: ignore[index]
        }
    }
