"""Settings of the page-view benchmark's server process: the benchmarks' settings, with the
database connection kept between calls as docs/deployment.md advises for ASGI servers (both
sides, ours and the bare consumer, run on them)."""

from __future__ import annotations

from benchmarks.settings import *  # noqa: F403
from benchmarks.settings import DATABASES

DATABASES["default"]["CONN_MAX_AGE"] = 60
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
