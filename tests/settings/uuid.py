"""A site whose user model is keyed by a UUID (tests.sites.uuidsite): `make test` runs the store,
API, endpoint, consumer, hub, template tag, cleanup, feed and DRF tests again with these settings
(those marked ``uuid_site``: ``-m uuid_site``), and tests/sites/test_uuidsite.py."""

from __future__ import annotations

from tests.settings.base import *  # noqa: F403
from tests.settings.base import INSTALLED_APPS, TEMPLATES

INSTALLED_APPS = [
    app for app in INSTALLED_APPS if app not in {"siteproject.demo", "tests.sites.graphsite"}
] + ["tests.sites.uuidsite"]
AUTH_USER_MODEL = "uuidsite.User"
ROOT_URLCONF = "tests.sites.uuidsite.urls"
LOCALE_PATHS = []  # the demo's catalogs (siteproject/settings.py) leave with the demo
# and so do its templates (templates/: its pages, and presence/base.html in its layout)
TEMPLATES = [{**TEMPLATES[0], "DIRS": []}]
LOGIN_URL = "/accounts/login/"  # Django's default, for its login page leaves with it too
