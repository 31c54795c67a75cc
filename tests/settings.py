"""Settings for the test suite: the demo site's settings (the demo is tested too), with a real
Redis from REDIS_URL (tests/conftest.py insists on it) and SQLite, or DATABASE_URL."""

from __future__ import annotations

import dj_database_url

from siteproject.settings import *  # noqa: F403
from siteproject.settings import BASE_DIR, INSTALLED_APPS

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]

# Daphne only replaces runserver; the tests have no use for it.
INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "daphne"]

DATABASES = {"default": dj_database_url.config(default=f"sqlite:///{BASE_DIR / 'test.sqlite3'}")}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tests capture presence's log records themselves (caplog); keep Django's defaults quiet.
LOGGING_CONFIG = None
