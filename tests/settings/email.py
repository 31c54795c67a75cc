"""A site whose user model logs in by e-mail (tests.sites.emailsite), with no User admin registered:
`make test` runs tests/sites/test_emailsite.py with these settings after the main suite."""

from __future__ import annotations

from tests.settings.base import *  # noqa: F403
from tests.settings.base import INSTALLED_APPS, TEMPLATES

INSTALLED_APPS = [
    app for app in INSTALLED_APPS if app not in {"siteproject.demo", "tests.sites.graphsite"}
] + ["tests.sites.emailsite"]
AUTH_USER_MODEL = "emailsite.User"
ROOT_URLCONF = "tests.sites.emailsite.urls"
LOCALE_PATHS = []  # the demo's catalogs (siteproject/settings.py) leave with the demo
# and so do its templates (templates/: its pages, and presence/base.html in its layout)
TEMPLATES = [{**TEMPLATES[0], "DIRS": []}]
LOGIN_URL = "/accounts/login/"  # Django's default, for its login page leaves with it too
