"""A Hacker-News-style site nobody here wrote, wired to presence from the README alone;
tests/sites/test_hnsite.py runs with these settings (make test's hn_site run).

The settings module a site owner has: `startproject`'s, with a UUID-keyed user model and no
CACHES at all. Then, below the line, the README's "Wiring it into a site" snippet as the owner
pasted it: only the Redis URLs are the test Redis's (REDIS_URL). The site has no user admin of
its own; its admin.py is the book's guarded snippet. Its stories list renders each author through
three nested inclusion tags (tests/sites/hnsite/templatetags/hn.py)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from django.conf import global_settings  # with the other imports, at the top

BASE_DIR = Path(__file__).resolve().parent.parent.parent
SECRET_KEY = "hn-tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "tests.sites.hnsite",
]

ROOT_URLCONF = "tests.sites.hnsite.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# One SQLite file per test run, in memory where there is /dev/shm (as tests/settings/base.py).
_dir = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(_dir, "presence-hn.db"),  # nothing in the checkout
        "TEST": {"NAME": os.path.join(_dir, f"presence-hn-test-{os.getpid()}.db")},
        # docs/deployment.md "SQLite under an ASGI server" (presence.W005)
        "OPTIONS": {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL;",
        },
    }
}
AUTH_USER_MODEL = "hnsite.User"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
LOGGING_CONFIG = None  # the tests capture presence's log records themselves

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# --- below: the README's snippet, pasted ----------------------------------------------------
INSTALLED_APPS = ["daphne", *INSTALLED_APPS, "channels", "presence"]  # daphne first (runserver)
ASGI_APPLICATION = "tests.sites.hnsite.asgi.application"

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "presence.middleware.PresenceMiddleware",  # after AuthenticationMiddleware
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# A django-redis cache alias of presence's own, added to the CACHES settings.py has, or to
# Django's default where it has none: your "default" cache stays as it is either way.
CACHES = {
    **globals().get("CACHES", global_settings.CACHES),
    "presence": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
    },
}
PRESENCE = {"CACHE_ALIAS": "presence"}
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    }
}
