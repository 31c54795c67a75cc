"""Settings of the daphne processes serving the forum to the browser test (tests/daphne.py,
tests/sites/test_forumsite_browser.py): the forum's own, on the test database the test process
created, its media files, and the test's PRESENCE timings over the forum's PRESENCE."""

from __future__ import annotations

import json
import os

from tests.settings.forum import *  # noqa: F403
from tests.settings.forum import DATABASES as _DATABASES
from tests.settings.forum import PRESENCE as _PRESENCE

DEBUG = True  # the README's asgi.py serves static files (presence.js) in DEBUG only; the
# forum's urls.py its media files (the avatars)

DATABASES = {"default": {**_DATABASES["default"], "NAME": os.environ["PRESENCE_TEST_DATABASE"]}}
PRESENCE = {**_PRESENCE, **json.loads(os.environ.get("PRESENCE_TEST_SETTINGS") or "{}")}
MEDIA_ROOT = os.environ["FORUM_MEDIA_ROOT"]
