"""A forum shaped as Spirit (categories, topics, private topics with participants, a user list,
avatars), wired to presence from the README and the book alone (issue 38);
tests/sites/test_forumsite.py runs with these settings (make test's forum_site run).

Above the line: the settings the forum has without presence (startproject's, a custom user
model with an avatar, a login page, media files). Below it: what the book told the site owner
to add, each block under the page it came from. Only the Redis URL is the test Redis's
(REDIS_URL), and the database is the test run's."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import dj_database_url
from django.conf import global_settings  # with the other imports, at the top

BASE_DIR = Path(__file__).resolve().parent.parent.parent
SECRET_KEY = "forum-tests-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "tests.sites.forumsite",
]

ROOT_URLCONF = "tests.sites.forumsite.urls"

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

# The test run's database: SQLite in a file (in memory where there is /dev/shm), one per run,
# so that the daphne processes of the browser test open the one this process created; or
# DATABASE_URL (PostgreSQL), as the rest of the suite.
_dir = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{os.path.join(_dir, 'presence-forum.db')}"  # nothing in the checkout
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["TEST"] = {"NAME": os.path.join(_dir, f"presence-forum-{os.getpid()}.db")}
AUTH_USER_MODEL = "forumsite.User"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
MEDIA_URL = "/media/"
MEDIA_ROOT = os.path.join(_dir, f"presence-forum-media-{os.getpid()}")  # the tests set their own
LOGIN_REDIRECT_URL = "/"  # LOGIN_URL: Django's default, /accounts/login/
LOGGING_CONFIG = None  # the tests capture presence's log records themselves

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# --- below: what the book says to add -----------------------------------------------------
# README "Wiring it into a site" (= docs/getting-started.md), pasted:
INSTALLED_APPS = ["daphne", *INSTALLED_APPS, "channels", "presence"]  # daphne first (runserver)
ASGI_APPLICATION = "tests.sites.forumsite.asgi.application"

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
PRESENCE = {
    "CACHE_ALIAS": "presence",
    # docs/privacy.md "A public site": dots are not grey until users follow each other
    "DEFAULT_PRIVACY": {"online_visibility": "everyone", "last_seen_visibility": "everyone"},
    # docs/rooms.md "Declaring rooms": a topic's room admits whoever may read the topic
    "ROOMS": {"topic": "tests.sites.forumsite.rooms.can_enter_topic"},
    # docs/rooms.md "Member cards": names and avatars in rooms and lists
    "MEMBER_CARD": "tests.sites.forumsite.cards.member_card",
    # docs/api.md "Guests": "3 members and 12 guests online"
    "COUNT_GUESTS": True,
}
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    }
}

# docs/deployment.md "SQLite under an ASGI server" (presence.W005), for a SQLite database:
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL;",
    }
