"""Settings of the daphne processes the live tests start (tests/daphne.py): the test suite's
settings, on the test database the test process created, with ``PRESENCE`` from the environment.
"""

from __future__ import annotations

import json
import os

from tests.settings.base import *  # noqa: F403
from tests.settings.base import DATABASES as _DATABASES

# siteproject.asgi serves static files (presence.js) only in DEBUG.
DEBUG = True

DATABASES = {
    "default": {**_DATABASES["default"], "NAME": os.environ["PRESENCE_TEST_DATABASE"]},
}
PRESENCE = json.loads(os.environ.get("PRESENCE_TEST_SETTINGS") or "{}")
_layer_hosts = json.loads(os.environ.get("PRESENCE_TEST_LAYER_HOSTS") or "[]")
if _layer_hosts:
    CHANNEL_LAYERS = {
        "default": {
            **CHANNEL_LAYERS["default"],  # noqa: F405
            "CONFIG": {**CHANNEL_LAYERS["default"]["CONFIG"], "hosts": _layer_hosts},  # type: ignore[dict-item]  # noqa: F405
        }
    }
if os.environ.get("PRESENCE_TEST_SIGNAL_LIST"):
    # tests/load/test_signals_multiprocess.py counts each process's signals in Redis.
    INSTALLED_APPS = [*INSTALLED_APPS, "tests.sites.signal_probe"]  # noqa: F405
