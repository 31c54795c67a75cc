"""Settings of the load test's daphne processes and of its harness (``python -m tools.loadtest``).

The demo site (``siteproject``), configured from the environment the harness sets:

- ``LOADTEST_DATABASE``: a database URL (PostgreSQL) or the path of a SQLite file;
- ``LOADTEST_REDIS_URL`` or ``LOADTEST_CLUSTER_URLS`` (comma-separated): presence's Redis;
- ``LOADTEST_LAYER_HOSTS``: the channel layer's Redis servers (comma-separated; it shards over
  them, so that one can be stopped as a fault);
- ``LOADTEST_PRESENCE``: the compressed timing, as JSON (``tools.loadtest.config``);
- ``LOADTEST_PRESENCE_OVERRIDES`` (servers only, diagnosis): presence settings over those, as JSON;
- ``LOADTEST_MEMORY_DIR`` (servers only): where the process writes its memory census
  (``tools.loadtest.memory``).

Sessions are signed cookies: the harness makes 10,000 of them without a database row each, and a
Redis restart (a fault) does not log anyone out.
"""

from __future__ import annotations

import json
import os

import dj_database_url

from siteproject.settings import *  # noqa: F403
from siteproject.settings import CHANNEL_LAYERS as _CHANNEL_LAYERS

SECRET_KEY = "loadtest-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

_database = os.environ.get("LOADTEST_DATABASE", "")
if "://" in _database:
    # Persistent connections, checked before reuse (docs/deployment.md): a socket's frames and
    # the hub's deliveries would otherwise open a new PostgreSQL connection each time.
    DATABASES = {
        "default": dj_database_url.parse(_database, conn_max_age=60, conn_health_checks=True)
    }
    # The fault "terminate PostgreSQL connections" ends the servers' connections by this name.
    DATABASES["default"]["OPTIONS"] = {
        "application_name": os.environ.get("LOADTEST_APPLICATION", "loadtest-harness")
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _database or "loadtest.sqlite3",
            # Persistent connections, as docs/deployment.md advises: channels' AuthMiddleware
            # closes old connections around each socket's user lookup, and with the default of
            # 0 every connect opened a new SQLite connection (4 % of a storm's server time).
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
            # Several processes write the same file: wait for the lock rather than fail, and
            # take it at BEGIN (no upgrade deadlocks).
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

_redis_url = os.environ.get("LOADTEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": _redis_url}}

_layer_hosts: list[object] = [h for h in os.environ.get("LOADTEST_LAYER_HOSTS", "").split(",") if h]
# For diagnosis only (--layer-pool): channels_redis's connection pool per host and event loop
# (redis-py's default is 100 connections).
if os.environ.get("LOADTEST_LAYER_POOL"):
    _pool = int(os.environ["LOADTEST_LAYER_POOL"])
    _layer_hosts = [{"address": h, "max_connections": _pool} for h in _layer_hosts]
CHANNEL_LAYERS = {
    "default": {
        **_CHANNEL_LAYERS["default"],
        "CONFIG": {
            **_CHANNEL_LAYERS["default"]["CONFIG"],  # type: ignore[dict-item]
            "hosts": _layer_hosts or [_redis_url],
        },
    }
}
if os.environ.get("LOADTEST_LAYER") == "pubsub":
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": _layer_hosts or [_redis_url]},
        }
    }

SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

PRESENCE = json.loads(os.environ.get("LOADTEST_PRESENCE") or "{}")
# Diagnosis: presence settings for the servers only, over the harness's (--server-env
# LOADTEST_PRESENCE_OVERRIDES='{"OPENINGS_AT_ONCE": 48}').
PRESENCE.update(json.loads(os.environ.get("LOADTEST_PRESENCE_OVERRIDES") or "{}"))
_cluster = [url for url in os.environ.get("LOADTEST_CLUSTER_URLS", "").split(",") if url]
if _cluster:
    PRESENCE["REDIS_CLUSTER"] = _cluster

# Every record with its time, so that the harness can tell lines inside a fault's window from
# those outside it (daphne's stderr goes to one file per process).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"timed": {"format": "%(created).3f %(levelname)s %(name)s %(message)s"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "timed"}
        if not os.environ.get("LOADTEST_HARNESS_LOG")
        else {
            "class": "logging.FileHandler",
            "filename": os.environ["LOADTEST_HARNESS_LOG"],
            "formatter": "timed",
        }
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    # INFO: the hub names its channel (the fault "kill a daphne" tells its groups apart).
    "loggers": {"presence": {"handlers": ["console"], "level": "INFO", "propagate": False}},
}

if os.environ.get("LOADTEST_MEMORY_DIR"):
    from tools.loadtest.memory import start_census

    start_census(os.environ["LOADTEST_MEMORY_DIR"])

if os.environ.get("LOADTEST_SIGNALS_DIR"):
    # Each server logs the signals it sends (tools/loadtest/signals.py counts them).
    INSTALLED_APPS = [*INSTALLED_APPS, "tools.loadtest.signals.SignalLogConfig"]  # noqa: F405

if os.environ.get("LOADTEST_TIMING_DIR"):
    # Diagnosis: where a status change's time goes in the servers (tools/loadtest/timing.py).
    INSTALLED_APPS = [*INSTALLED_APPS, "tools.loadtest.timing.TimingConfig"]
