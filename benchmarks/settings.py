"""Settings for ``python -m benchmarks``: the test settings, a throwaway SQLite file, our urlconf.

``BENCH_DB_DIR`` is set by ``benchmarks.__main__`` to a fresh temporary directory, so every run
starts from an empty database (migrated programmatically) and leaves nothing behind.
"""

from __future__ import annotations

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
TEMPLATES = [
    {**TEMPLATES[0], "DIRS": [Path(__file__).resolve().parent / "templates"]},
]
