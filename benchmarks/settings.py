"""Settings for ``python -m benchmarks``: the test settings, a throwaway SQLite file, our urlconf.

``BENCH_DB_DIR`` is set by ``benchmarks.__main__`` to a fresh temporary directory, so every run
starts from an empty database (migrated programmatically) and leaves nothing behind.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import dj_database_url

from tests.settings.base import *  # noqa: F403
from tests.settings.base import TEMPLATES

_DB_DIR = Path(os.environ.get("BENCH_DB_DIR") or tempfile.gettempdir())

DEBUG = False
ROOT_URLCONF = "benchmarks.urls"
# Always SQLite (even when DATABASE_URL is set for the tests): the bulk setup uses SQLite SQL.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(_DB_DIR / "bench.sqlite3"),
    }
}
# The feed benchmark compares two table sizes side by side, in a second database of each kind,
# and runs on PostgreSQL too when given one (python -m benchmarks --postgres URL): that database
# and one named like it with "_small" appended (created when missing) are emptied.
DATABASES["feed_small"] = {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": str(_DB_DIR / "feed_small.sqlite3"),
}
if os.environ.get("BENCH_POSTGRES_URL"):
    DATABASES["postgres"] = dj_database_url.parse(os.environ["BENCH_POSTGRES_URL"])
    DATABASES["postgres_small"] = {
        **DATABASES["postgres"],
        "NAME": f"{DATABASES['postgres']['NAME']}_small",
    }
# The rooms_peers benchmark's peer (django-channels-presence, the ``bench`` extra), when
# installed, on SQLite and, given a PostgreSQL database (DATABASE_URL or BENCH_POSTGRES_URL), on
# one named after it with "_peers" appended (created when missing).
if importlib.util.find_spec("channels_presence") is not None:
    INSTALLED_APPS = [*INSTALLED_APPS, "channels_presence"]  # noqa: F405
    _peers_url = os.environ.get("BENCH_POSTGRES_URL") or os.environ.get("DATABASE_URL") or ""
    if _peers_url.startswith(("postgres://", "postgresql://")):
        DATABASES["peers_postgres"] = dj_database_url.parse(_peers_url)
        DATABASES["peers_postgres"]["NAME"] += "_peers"
TEMPLATES = [
    {**TEMPLATES[0], "DIRS": [Path(__file__).resolve().parent / "templates"]},
]
