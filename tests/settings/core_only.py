"""A site with presence alone (no presence.feed, and no demo, which uses the feed): the app
boundary tests (tests/feed/test_feed_app.py) run it in a subprocess."""

from __future__ import annotations

from tests.settings.base import *  # noqa: F403
from tests.settings.base import INSTALLED_APPS, TEMPLATES

INSTALLED_APPS = [app for app in INSTALLED_APPS if app not in {"presence.feed", "siteproject.demo"}]
ROOT_URLCONF = "tests.urls_core_only"
LOCALE_PATHS = []  # the demo's catalogs (siteproject/settings.py) leave with the demo
# and so do its templates (templates/: its pages, and presence/base.html in its layout)
TEMPLATES = [{**TEMPLATES[0], "DIRS": []}]
LOGIN_URL = "/accounts/login/"  # Django's default, for its login page leaves with it too
