"""System checks of the Redis and channel layer presence connects to (presence.E004, E005,
E009, W002). Ids are stable; each has a hint."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from presence.conf import user_settings
from presence.store import primary_location, redact_url, redis_location, redis_url_problem

DJANGO_REDIS_BACKENDS = {"django_redis.cache.RedisCache"}


@register(Tags.caches)
def check_redis_cluster(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = user_settings()
    urls = raw.get("REDIS_CLUSTER") if isinstance(raw, dict) else None
    if urls is None:
        return []
    if isinstance(urls, str) or not isinstance(urls, list | tuple) or not urls:
        problem = f"it is {redact_url(repr(urls))}"
    else:
        problem = next(filter(None, (redis_url_problem(url, cluster=True) for url in urls)), "")
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
        problem = redis_url_problem(primary_location(caches[alias]))
        return [
            Error(
                f"CACHES[{alias!r}]['LOCATION'] is not a URL presence can connect to: {problem}.",
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
    # Anything not a dict (CHANNEL_LAYERS or its "default" entry) is no channels_redis layer.
    default = layers.get("default") if isinstance(layers, dict) else None
    backend = default.get("BACKEND") if isinstance(default, dict) else None
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
