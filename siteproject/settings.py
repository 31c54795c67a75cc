"""Settings of the demo site. Not for production: DEBUG is on and the secret key is public.

Redis comes from ``REDIS_URL`` (``make demo`` starts a throwaway redis-server and sets it), the
database from ``DATABASE_URL`` (default: SQLite ``db.sqlite3`` in the repository root).
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from csp.constants import NONCE, NONE, SELF

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") != "0"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"

INSTALLED_APPS = [
    # First, so that `manage.py runserver` serves ASGI (and later WebSockets) too.
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "presence",
    "presence.feed",
    "siteproject.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # After AuthenticationMiddleware: it records request.user's activity.
    "presence.middleware.PresenceMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A strict Content Security Policy: scripts only from this site or with the response's nonce
    # (presence_script carries it), no inline event handlers.
    "csp.middleware.CSPMiddleware",
]

CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],  # 'self' covers the page's own ws:// and wss:// origin
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

ROOT_URLCONF = "siteproject.urls"
WSGI_APPLICATION = "siteproject.wsgi.application"
ASGI_APPLICATION = "siteproject.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {"default": dj_database_url.config(default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
# SQLite under an ASGI server (presence.W005, docs/deployment.md): a write transaction takes the
# lock as it begins and waits for it (a read-then-write one would fail at once with "database is
# locked" while another write holds it), and WAL lets reads go on beside a write.
SQLITE_OPTIONS = {
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL;",
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = dict(SQLITE_OPTIONS)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Presence reuses this django-redis cache's connection settings (PRESENCE["CACHE_ALIAS"]).
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
    }
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [REDIS_URL],
            # Each process's presence hub listens on one channel ("specific.*"): give it room
            # for bursts (channels_redis drops messages to a full channel; the default is 100).
            "channel_capacity": {"specific.*": 10000},
        },
    }
}

# Every key is optional; the defaults and their meaning are in docs/settings.md.
PRESENCE: dict[str, object] = {
    # Rooms (docs/rooms.md): who is reading a post, who of a group is in it now.
    "ROOMS": {
        "post": "siteproject.demo.rooms.can_read_post",
        "group": "siteproject.demo.rooms.is_group_member",
    },
}

# The activity feed's settings (presence/feed/conf.py, docs/feed.md).
PRESENCE_FEED: dict[str, object] = {
    # Mentions in activities link to the demo's profile pages (also in live timelines).
    "MENTION_URL": "demo:profile",
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "demo:login"
LOGIN_REDIRECT_URL = "demo:home"
LOGOUT_REDIRECT_URL = "demo:login"

USE_I18N = True
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en"
LANGUAGES = [
    ("en", "English"),
    ("ja", "日本語"),
    ("zh-hans", "简体中文"),
    ("vi", "Tiếng Việt"),
]

# The demo's own catalogs (`make messages`). Listed here, not only found as the demo app's locale
# directory, so that makemessages also has a home for the project templates (templates/demo/).
# LOCALE_PATHS win over the apps' catalogs: where a demo string is also in presence's or Django's
# (e.g. "Do not disturb", "Log out"), the demo's translation is theirs, so nothing else changes.
LOCALE_PATHS = [BASE_DIR / "siteproject" / "demo" / "locale"]

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"presence": {"handlers": ["console"], "level": "INFO"}},
}
