"""System checks for presence's configuration. Ids are stable; each has a hint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.utils.module_loading import import_string

from presence import domain, users
from presence.conf import SETTING_NAMES, PresenceSettings, user_settings
from presence.domain.rooms import is_valid_kind
from presence.store import redact_url, redis_location

MIDDLEWARE_PATH = "presence.middleware.PresenceMiddleware"
AUTH_MIDDLEWARE_PATH = "django.contrib.auth.middleware.AuthenticationMiddleware"
DJANGO_REDIS_BACKENDS = {"django_redis.cache.RedisCache"}

_POSITIVE_INTS = (
    "OPENINGS_AT_ONCE",
    "TOKEN_MAX_AGE",
    "ONLINE_WINDOW",
    "TOUCH_INTERVAL",
    "HEARTBEAT_INTERVAL",
    "CONNECTION_TTL",
    "IDLE_AFTER",
    "OFFLINE_GRACE",
    "MAX_SUBSCRIPTIONS",
    "MAX_CONNECTIONS_PER_USER",
    "BUCKETS",
    "TEXT_MAX_LENGTH",
    "EMOJI_MAX_LENGTH",
    "MAX_STATUS_EXPIRY",
    "CLEANUP_BATCH",
    "MAX_FRAME_BYTES",
    "MAX_UNSENT_BYTES",
    "SWEEP_BATCH",
    "CLUSTER_SHARDS",
    "SESSION_CHECK_INTERVAL",
    "MAX_ROOMS",
    "ROOM_LIST_LIMIT",
    "RESUME_WINDOW",
)
_POSITIVE_NUMBERS = (
    "SOCKET_TIMEOUT",
    "LIVE_SOCKET_TIMEOUT",
    "RETRY_INTERVAL",
    "COALESCE_WINDOW",
    "SWEEP_INTERVAL",
    "OPENING_HOLD",
)


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _bad_value(key: str, value: Any, expected: str) -> Error:
    return Error(
        f"PRESENCE[{key!r}] is {value!r}; it must be {expected}.",
        hint=f"Fix or remove PRESENCE[{key!r}] (default: {getattr(PresenceSettings, key)!r}).",
        id="presence.E002",
    )


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = user_settings()
    if not isinstance(raw, dict):
        return [
            Error(
                f"PRESENCE must be a dict, not {type(raw).__name__}.",
                hint='Set PRESENCE = {"ONLINE_WINDOW": 300, ...} or remove it for the defaults.',
                id="presence.E001",
            )
        ]
    messages: list[CheckMessage] = []
    # repr: keys of mixed types (a typo'd int key beside str keys) must not break sorting.
    for key in sorted(set(raw) - SETTING_NAMES, key=repr):
        messages.append(
            Warning(
                f"PRESENCE has an unknown key {key!r}; it is ignored.",
                hint="Known keys: " + ", ".join(sorted(SETTING_NAMES)) + ".",
                id="presence.W001",
            )
        )
    for key in _POSITIVE_INTS:
        if key in raw and not _is_positive_int(raw[key]):
            messages.append(_bad_value(key, raw[key], "a positive integer (seconds or a count)"))
    for key in _POSITIVE_NUMBERS:
        value = raw.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            messages.append(_bad_value(key, value, "a positive number of seconds"))
    for key in ("CACHE_ALIAS", "KEY_PREFIX"):
        value = raw.get(key, "x")
        if not isinstance(value, str) or not value or "{" in value or "}" in value:
            messages.append(_bad_value(key, value, "a non-empty string without { or }"))
    rate = raw.get("RATE_LIMIT", (1, 1))
    if not (isinstance(rate, list | tuple) and len(rate) == 2 and all(map(_is_positive_int, rate))):
        messages.append(_bad_value("RATE_LIMIT", rate, "a pair (frames, seconds) of positive ints"))
    for key, unit in (("HTTP_RATE_LIMIT", "requests"), ("HTTP_READ_LIMIT", "ids")):
        http_rate = raw.get(key, (1, 1))
        if http_rate is not None and not (
            isinstance(http_rate, list | tuple)
            and len(http_rate) == 2
            and all(map(_is_positive_int, http_rate))
        ):
            expected = f"a pair ({unit}, seconds) of positive ints, or None"
            messages.append(_bad_value(key, http_rate, expected))
    for key in ("APPROXIMATE_LAST_SEEN", "RECIPROCAL_LAST_SEEN", "COUNT_GUESTS"):
        if key in raw and not isinstance(raw[key], bool):
            messages.append(_bad_value(key, raw[key], "True or False"))
    messages += _lengths_beyond_columns(raw)
    messages += _default_privacy_problems(raw)
    messages += _room_problems(raw)
    messages += _card_problems(raw)
    heartbeat = raw.get("HEARTBEAT_INTERVAL", PresenceSettings.HEARTBEAT_INTERVAL)
    ttl = raw.get("CONNECTION_TTL", PresenceSettings.CONNECTION_TTL)
    if _is_positive_int(heartbeat) and _is_positive_int(ttl) and ttl <= heartbeat:
        messages.append(
            Error(
                f"PRESENCE['CONNECTION_TTL'] ({ttl}) must exceed "
                f"PRESENCE['HEARTBEAT_INTERVAL'] ({heartbeat}).",
                hint="A live connection must have time to send a heartbeat before it is "
                "declared gone; use a TTL of about three heartbeat intervals.",
                id="presence.E003",
            )
        )
    return messages


_LEVELS = tuple(level.value for level in domain.Visibility)


def _default_privacy_problems(raw: dict[str, Any]) -> list[CheckMessage]:
    """presence.E010: a DEFAULT_PRIVACY that is not a dict of visibility settings to levels.
    Until it is fixed, presence uses "contacts" where it names no valid level."""
    if "DEFAULT_PRIVACY" not in raw:
        return []
    levels = raw["DEFAULT_PRIVACY"]
    if not isinstance(levels, Mapping):
        problems = [f"it is {levels!r}, not a dict"]
    else:
        problems = [
            f"{key!r} is not a visibility setting"
            for key in levels
            if key not in domain.VISIBILITY_SETTINGS
        ] + [
            f"{key!r} is {level!r}, not a level"
            for key, level in levels.items()
            if key in domain.VISIBILITY_SETTINGS
            and not (isinstance(level, str) and level in _LEVELS)
        ]
    if not problems:
        return []
    return [
        Error(
            "PRESENCE['DEFAULT_PRIVACY'] must map visibility settings to levels: "
            + "; ".join(problems)
            + ". Meanwhile users without privacy settings get 'contacts' wherever it names no "
            "valid level.",
            hint='Set e.g. "DEFAULT_PRIVACY": {"online_visibility": "everyone", '
            '"last_seen_visibility": "everyone"}; keys: '
            + ", ".join(domain.VISIBILITY_SETTINGS)
            + "; levels: "
            + ", ".join(_LEVELS)
            + ' (a key left out is "contacts").',
            id="presence.E010",
        )
    ]


def _room_problems(raw: dict[str, Any]) -> list[CheckMessage]:
    """presence.E011: ROOMS is not a dict of kinds to dotted paths or None; presence.E012: a
    path that does not import, or names something not callable. Such kinds refuse everyone."""
    if "ROOMS" not in raw:
        return []
    kinds = raw["ROOMS"]
    if not isinstance(kinds, Mapping):
        problems = [f"it is {kinds!r}, not a dict"]
    else:
        problems = [
            f"{kind!r} is not a kind (a lowercase letter, then lowercase letters, digits, _ or -)"
            for kind in kinds
            if not is_valid_kind(kind)
        ] + [
            f"{kind!r} maps to {path!r}, not a dotted path or None"
            for kind, path in kinds.items()
            if path is not None and not (isinstance(path, str) and path)
        ]
    if problems:
        return [
            Error(
                "PRESENCE['ROOMS'] must map room kinds to the dotted path of their "
                "can_enter(user, room_id) rule, or None: " + "; ".join(problems) + ".",
                hint='e.g. "ROOMS": {"post": "blog.rooms.can_read_post", "lobby": None}.',
                id="presence.E011",
            )
        ]
    messages: list[CheckMessage] = []
    for kind, path in kinds.items():
        if path is None:
            continue
        problem = _not_a_function(path)
        if problem is None:
            continue
        messages.append(
            Error(
                f"PRESENCE['ROOMS'][{kind!r}] = {path!r} {problem}; rooms of kind {kind!r} "
                "refuse everyone until it is fixed.",
                hint="Name a function can_enter(user, room_id) -> bool by its dotted path "
                '(e.g. "blog.rooms.can_read_post"), or None to let any logged-in user in.',
                id="presence.E012",
            )
        )
    return messages


def _not_a_function(path: str) -> str | None:
    """Why the dotted ``path`` names no function (it does not import, or is not callable)."""
    try:
        found = import_string(path)
    except ImportError as error:
        return f"does not import ({error})"
    return None if callable(found) else f"names a {type(found).__name__}, not a function"


def _card_problems(raw: dict[str, Any]) -> list[CheckMessage]:
    """presence.E013: MEMBER_CARD is neither None nor the dotted path of a function. Members
    are shown by their default cards until it is fixed."""
    path = raw.get("MEMBER_CARD")
    if path is None:
        return []
    valid = isinstance(path, str) and path
    problem = _not_a_function(path) if valid else "is not a dotted path or None"
    if problem is None:
        return []
    return [
        Error(
            f"PRESENCE['MEMBER_CARD'] = {path!r} {problem}; members are shown by their default "
            "cards (full name else username, no avatar) until it is fixed.",
            hint='Name a function card(user) -> {"name": str, "avatar": url or None} by its '
            'dotted path (e.g. "accounts.cards.member_card"), or remove the key.',
            id="presence.E013",
        )
    ]


#: length settings and the UserStatus columns whose values they bound
_LENGTH_COLUMNS = {"TEXT_MAX_LENGTH": ("text", "activity"), "EMOJI_MAX_LENGTH": ("emoji",)}


def _lengths_beyond_columns(raw: dict[str, Any]) -> list[CheckMessage]:
    """presence.W003: a length setting the database column cannot hold. Validation would let
    such a value through and the database refuse it (PostgreSQL: a 500) or, on SQLite, keep it
    whole. The limits are read from the model fields."""
    from presence.models import UserStatus

    messages: list[CheckMessage] = []
    for key, columns in _LENGTH_COLUMNS.items():
        value = raw.get(key, getattr(PresenceSettings, key))
        if not _is_positive_int(value):
            continue  # presence.E002 reports it
        for column in columns:
            max_length = getattr(UserStatus._meta.get_field(column), "max_length", None)
            if max_length is not None and value > max_length:
                messages.append(
                    Warning(
                        f"PRESENCE[{key!r}] is {value}, but the {column!r} column of "
                        f"UserStatus holds at most {max_length} characters.",
                        hint=f"Set PRESENCE[{key!r}] to at most {max_length}: a longer "
                        "value passes validation and then fails in the database.",
                        id="presence.W003",
                    )
                )
    return messages


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


@register(Tags.compatibility)
def check_middleware(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    middleware = list(getattr(settings, "MIDDLEWARE", []) or [])
    if MIDDLEWARE_PATH not in middleware:
        return [
            Error(
                f"{MIDDLEWARE_PATH} is not in MIDDLEWARE, so page views are not recorded.",
                hint=f"Add {MIDDLEWARE_PATH!r} to MIDDLEWARE after {AUTH_MIDDLEWARE_PATH!r}.",
                id="presence.E006",
            )
        ]
    if AUTH_MIDDLEWARE_PATH not in middleware or middleware.index(
        AUTH_MIDDLEWARE_PATH
    ) > middleware.index(MIDDLEWARE_PATH):
        return [
            Error(
                f"{MIDDLEWARE_PATH} must come after {AUTH_MIDDLEWARE_PATH} in MIDDLEWARE.",
                hint="It needs request.user; move it below AuthenticationMiddleware.",
                id="presence.E007",
            )
        ]
    return []


@register(Tags.models)
def check_user_model(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """presence.E008: a user model whose primary key presence cannot key by. Integer, UUID and
    string (CharField, TextField) keys work; a composite key (or a date, bytes, ...) does not."""
    pk = users.pk_field()
    if users.kind_of(pk) is not None:
        return []
    return [
        Error(
            f"The user model's primary key is a {type(pk).__name__}; presence needs an "
            "integer, UUID or string primary key.",
            hint="Presence names users in Redis, URLs and WebSocket frames by one primary key "
            "value: use an AutoField/BigAutoField, a UUIDField or a CharField as the pk.",
            id="presence.E008",
        )
    ]


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


REQUEST_CONTEXT_PROCESSOR = "django.template.context_processors.request"


@register(Tags.templates)
def check_request_context_processor(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """presence.W004: presence's template tags read the viewer from the context's request; without
    the context processor only pages rendered with their request (a RequestContext) have one."""
    engines = [
        engine
        for engine in getattr(settings, "TEMPLATES", [])
        if engine.get("BACKEND") == "django.template.backends.django.DjangoTemplates"
    ]
    if not engines or any(
        REQUEST_CONTEXT_PROCESSOR in engine.get("OPTIONS", {}).get("context_processors", [])
        for engine in engines
    ):
        return []
    return [
        Warning(
            "No DjangoTemplates engine has the 'request' context processor: presence's "
            "template tags then rely on each page being rendered with its request "
            "(render(request, ...)); one rendered without it shows every user as a stranger "
            "sees them (quietly offline).",
            hint=f"Add {REQUEST_CONTEXT_PROCESSOR!r} to TEMPLATES[...]['OPTIONS']"
            "['context_processors'].",
            id="presence.W004",
        )
    ]
