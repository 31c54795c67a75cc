"""System checks of the Redis and channel layer presence connects to (presence.E004, E005,
E009, W002). Ids are stable; each has a hint."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from presence.conf import user_settings
from presence.store import redact_url, redis_location

DJANGO_REDIS_BACKENDS = {"django_redis.cache.RedisCache"}

CLUSTER_SCHEMES = frozenset({"redis", "rediss"})


def _cluster_url_problem(url: Any) -> str | None:
    """Why ``url`` is not a Redis Cluster startup node URL, or None (no network I/O)."""
    # Never the URL itself: it may carry a password (printed by manage.py check, in CI logs).
    shown = redact_url(repr(url))
    if not isinstance(url, str):
        return f"{shown} is not a string"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        # Not the error's text: urlsplit quotes the piece it failed on, maybe of the password.
        return (
            f"{shown} is not a URL: its host or port cannot be read (percent-encode any "
            "/ ? # @ [ ] in a user name or password)"
        )
    if parts.scheme not in CLUSTER_SCHEMES:
        return f"{shown} is not a redis:// or rediss:// URL"
    if not parts.hostname:
        return f"{shown} has no host"
    if port is None:
        return f"{shown} has no port"
    if parts.path.strip("/") not in {"", "0"}:
        return f"{shown} names database {parts.path.strip('/')!r}; a cluster has only database 0"
    return None


@register(Tags.caches)
def check_redis_cluster(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = user_settings()
    urls = raw.get("REDIS_CLUSTER") if isinstance(raw, dict) else None
    if urls is None:
        return []
    if isinstance(urls, str) or not isinstance(urls, list | tuple) or not urls:
        problem = f"it is {redact_url(repr(urls))}"
    else:
        problem = next(filter(None, map(_cluster_url_problem, urls)), "")
    if not problem:
        return []
    return [
        Error(
            "PRESENCE['REDIS_CLUSTER'] must be a non-empty list of startup node URLs: " + problem,
            hint='Set "REDIS_CLUSTER": ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"] '
            "(rediss:// for TLS, credentials as redis://user:password@host:port), or leave "
            "it out to use the Redis of CACHE_ALIAS.",
            id="presence.E009",
        )
    ]


@register(Tags.caches)
def check_cache(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = user_settings()
    if isinstance(raw, dict) and raw.get("REDIS_CLUSTER") is not None:
        return []  # presence's state is on the cluster: no cache is needed (E009 checks it)
    alias = raw.get("CACHE_ALIAS", "default") if isinstance(raw, dict) else "default"
    if not isinstance(alias, str):
        return []  # presence.E002 reports it (and a list alias is not even hashable)
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        return [
            Error(
                f"PRESENCE['CACHE_ALIAS'] is {alias!r}, but CACHES has no such alias.",
                hint="Add a django-redis cache under that alias, or point CACHE_ALIAS at one.",
                id="presence.E004",
            )
        ]
    backend = caches[alias].get("BACKEND", "")
    if backend not in DJANGO_REDIS_BACKENDS:
        return [
            Error(
                f"CACHES[{alias!r}] uses {backend!r}; presence needs a django-redis cache.",
                hint='Set "BACKEND": "django_redis.cache.RedisCache" and a redis:// LOCATION.',
                id="presence.E005",
            )
        ]
    # The store connects to the first location itself (presence.store), so it must be a URL.
    if redis_location(caches[alias]) is None:
        location = caches[alias].get("LOCATION")
        return [
            Error(
                f"CACHES[{alias!r}]['LOCATION'] is {redact_url(repr(location))}; presence needs "
                "a redis://, rediss:// or unix:// URL.",
                hint='Set "LOCATION": "redis://HOST:6379/0".',
                id="presence.E005",
            )
        ]
    return []


CHANNELS_REDIS_BACKENDS = {
    "channels_redis.core.RedisChannelLayer",
    "channels_redis.pubsub.RedisPubSubChannelLayer",
}


@register(Tags.compatibility)
def check_channel_layer(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    layers = getattr(settings, "CHANNEL_LAYERS", None) or {}
    backend = layers.get("default", {}).get("BACKEND") if isinstance(layers, dict) else None
    if backend in CHANNELS_REDIS_BACKENDS:
        return []
    return [
        Warning(
            "CHANNEL_LAYERS has no 'default' channels_redis layer "
            f"(BACKEND is {backend!r}), so live updates reach only the WebSocket connections of "
            "the process where a change happens.",
            hint='Set CHANNEL_LAYERS = {"default": {"BACKEND": '
            '"channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}.',
            id="presence.W002",
        )
    ]
