"""System checks presence.E001..E009, E014, E015 and W001..W006 (the rooms' and the default
privacy's elsewhere): each fails on a bad config, passes on a good one."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.core.checks import CheckMessage, registry, run_checks
from django.db import models
from django.test.utils import isolate_apps

from presence import checks, database_checks

MIDDLEWARE = "presence.middleware.PresenceMiddleware"
AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"
SESSIONS = "django.contrib.sessions.middleware.SessionMiddleware"

ALL_CHECKS: list[Callable[..., list[CheckMessage]]] = [
    checks.check_settings,
    checks.check_redis_cluster,
    checks.check_cache,
    checks.check_middleware,
    checks.check_user_model,
]


def ids(*functions: Callable[..., list[CheckMessage]]) -> list[str]:
    found = [message.id for function in functions or ALL_CHECKS for message in function()]
    return [i for i in found if i is not None]


def messages_with(check_id: str) -> list[CheckMessage]:
    return [m for function in ALL_CHECKS for m in function() if m.id == check_id]


def test_the_test_settings_pass_every_check() -> None:
    assert ids() == []


def test_checks_are_registered_with_django(settings: Any) -> None:
    # run_checks is what `manage.py check` calls; our ids reach it.
    settings.PRESENCE = {"ONLINE_WINDOW": 0, "NOPE": 1}
    settings.MIDDLEWARE = [SESSIONS, AUTH]
    settings.ASGI_APPLICATION = None  # W005 has tests of its own (the test database's options)
    found = {m.id for m in run_checks() if m.id and m.id.startswith("presence.")}
    assert found == {"presence.E002", "presence.W001", "presence.E006"}


# --- E001: PRESENCE is not a dict --------------------------------------------------------------


@pytest.mark.parametrize("value", [None, [("ONLINE_WINDOW", 300)], "ONLINE_WINDOW=300", 300])
def test_e001_presence_must_be_a_dict(settings: Any, value: Any) -> None:
    settings.PRESENCE = value
    assert ids(checks.check_settings) == ["presence.E001"]
    (message,) = messages_with("presence.E001")
    assert type(value).__name__ in message.msg and message.hint
    # The cache check still runs on the default alias instead of crashing.
    assert ids(checks.check_cache) == []


def test_e001_absent_for_a_dict_or_no_setting(settings: Any) -> None:
    settings.PRESENCE = {}
    assert "presence.E001" not in ids()
    del settings.PRESENCE
    assert "presence.E001" not in ids()


# --- E002: a value of the wrong type or range --------------------------------------------------

INT_KEYS = [
    "ONLINE_WINDOW",
    "TOUCH_INTERVAL",
    "HEARTBEAT_INTERVAL",
    "IDLE_AFTER",
    "OFFLINE_GRACE",
    "MAX_SUBSCRIPTIONS",
    "MAX_CONNECTIONS_PER_USER",
    "BUCKETS",
    "TEXT_MAX_LENGTH",
    "EMOJI_MAX_LENGTH",
    "MAX_STATUS_EXPIRY",
    "CLEANUP_BATCH",
    "RESUME_WINDOW",
]


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("bad", [0, -5, "30", 1.5, True, None])
def test_e002_counts_and_seconds_must_be_positive_ints(settings: Any, key: str, bad: Any) -> None:
    settings.PRESENCE = {key: bad}
    assert ids(checks.check_settings) == ["presence.E002"]
    (message,) = messages_with("presence.E002")
    assert repr(key) in message.msg and repr(bad) in message.msg


@pytest.mark.parametrize("key", INT_KEYS)
def test_e002_absent_for_small_positive_ints(settings: Any, key: str) -> None:
    # Small values (1-3 s) are valid and used by tests (a resume window that short is warned
    # about as too short for the heartbeats: W006, not E002; a window that short takes a
    # TOUCH_INTERVAL below it, E015).
    settings.PRESENCE = {key: 2, **({"TOUCH_INTERVAL": 1} if key == "ONLINE_WINDOW" else {})}
    expected = ["presence.W006"] if key == "RESUME_WINDOW" else []
    assert ids(checks.check_settings) == expected


def test_e002_connection_ttl_must_be_a_positive_int(settings: Any) -> None:
    # (CONNECTION_TTL alone: valid values of it also have to exceed the heartbeat, see E003.)
    settings.PRESENCE = {"CONNECTION_TTL": -90}
    assert ids(checks.check_settings) == ["presence.E002"]
    settings.PRESENCE = {"CONNECTION_TTL": 31}
    assert ids(checks.check_settings) == []


@pytest.mark.parametrize("key", ["SOCKET_TIMEOUT", "LIVE_SOCKET_TIMEOUT", "RETRY_INTERVAL"])
@pytest.mark.parametrize("bad", [0, -1, 0.0, "0.5", True, None])
def test_e002_timeouts_must_be_positive_numbers(settings: Any, key: str, bad: Any) -> None:
    settings.PRESENCE = {key: bad}
    assert ids(checks.check_settings) == ["presence.E002"]


@pytest.mark.parametrize("key", ["APPROXIMATE_LAST_SEEN", "RECIPROCAL_LAST_SEEN", "COUNT_GUESTS"])
def test_e002_last_seen_switches_must_be_booleans(settings: Any, key: str) -> None:
    for bad in (1, "yes", None):
        settings.PRESENCE = {key: bad}
        assert ids(checks.check_settings) == ["presence.E002"]
        (message,) = messages_with("presence.E002")
        assert "True or False" in message.msg
    for good in (True, False):
        settings.PRESENCE = {key: good}
        assert ids(checks.check_settings) == []


@pytest.mark.parametrize("key", ["SOCKET_TIMEOUT", "LIVE_SOCKET_TIMEOUT", "RETRY_INTERVAL"])
@pytest.mark.parametrize("good", [0.25, 2])
def test_e002_absent_for_positive_seconds(settings: Any, key: str, good: float) -> None:
    settings.PRESENCE = {key: good}
    assert ids(checks.check_settings) == []


@pytest.mark.parametrize("key", ["CACHE_ALIAS", "KEY_PREFIX"])
@pytest.mark.parametrize("bad", ["", "pre{fix", "pre}fix", 5, None, ["default"]])
def test_e002_names_must_be_plain_strings(settings: Any, key: str, bad: Any) -> None:
    # Braces would break the Redis Cluster hash tags of presence's keys.
    settings.PRESENCE = {key: bad}
    assert ids(checks.check_settings) == ["presence.E002"]


@pytest.mark.parametrize("bad", [5, None, ["default"]])
def test_cache_check_leaves_a_non_string_alias_to_e002(settings: Any, bad: Any) -> None:
    # A list is not even hashable: the cache check must not crash on it.
    settings.PRESENCE = {"CACHE_ALIAS": bad}
    assert ids(checks.check_cache) == []
    assert ids() == ["presence.E002"]


def test_e002_absent_for_a_custom_prefix(settings: Any) -> None:
    settings.PRESENCE = {"KEY_PREFIX": "site1:presence"}
    assert ids() == []


@pytest.mark.parametrize(
    "bad", [(60,), (60, 10, 1), (60, 0), (0, 10), ("60", "10"), (True, 10), "60/10", 60, None]
)
def test_e002_rate_limit_must_be_a_pair_of_positive_ints(settings: Any, bad: Any) -> None:
    settings.PRESENCE = {"RATE_LIMIT": bad}
    assert ids(checks.check_settings) == ["presence.E002"]


@pytest.mark.parametrize("good", [(60, 10), [5, 1]])
def test_e002_absent_for_a_rate_limit_pair(settings: Any, good: Any) -> None:
    settings.PRESENCE = {"RATE_LIMIT": good}
    assert ids(checks.check_settings) == []


def test_e002_reports_every_bad_key(settings: Any) -> None:
    settings.PRESENCE = {"ONLINE_WINDOW": 0, "TOUCH_INTERVAL": "30", "RATE_LIMIT": (1,)}
    reported = "".join(m.msg for m in messages_with("presence.E002"))
    assert ids(checks.check_settings) == ["presence.E002"] * 3
    assert all(repr(k) in reported for k in ("ONLINE_WINDOW", "TOUCH_INTERVAL", "RATE_LIMIT"))


# --- E003: CONNECTION_TTL must exceed HEARTBEAT_INTERVAL ---------------------------------------


@pytest.mark.parametrize(
    "conf",
    [
        {"HEARTBEAT_INTERVAL": 30, "CONNECTION_TTL": 30},
        {"HEARTBEAT_INTERVAL": 30, "CONNECTION_TTL": 20},
        {"CONNECTION_TTL": 30},  # against the default heartbeat of 30
        # against the default TTL of 90 (and a resume window long enough: W006)
        {"HEARTBEAT_INTERVAL": 90, "RESUME_WINDOW": 3600},
    ],
)
def test_e003_ttl_not_above_heartbeat(settings: Any, conf: dict[str, int]) -> None:
    settings.PRESENCE = conf
    assert ids(checks.check_settings) == ["presence.E003"]


@pytest.mark.parametrize(
    "conf",
    [
        {"HEARTBEAT_INTERVAL": 1, "CONNECTION_TTL": 3},
        {"CONNECTION_TTL": 31},
        {"HEARTBEAT_INTERVAL": 89, "RESUME_WINDOW": 3600},
    ],
)
def test_e003_absent_when_ttl_exceeds_heartbeat(settings: Any, conf: dict[str, int]) -> None:
    settings.PRESENCE = conf
    assert ids(checks.check_settings) == []


# --- E015: TOUCH_INTERVAL must be below ONLINE_WINDOW ------------------------------------------


@pytest.mark.parametrize(
    "conf",
    [
        {"ONLINE_WINDOW": 60, "TOUCH_INTERVAL": 60},
        {"ONLINE_WINDOW": 60, "TOUCH_INTERVAL": 120},
        {"ONLINE_WINDOW": 30},  # against the default interval of 30
        {"TOUCH_INTERVAL": 300},  # against the default window of 300
    ],
)
def test_e015_touch_interval_not_below_online_window(settings: Any, conf: dict[str, int]) -> None:
    settings.PRESENCE = conf
    assert ids(checks.check_settings) == ["presence.E015"]
    (error,) = messages_with("presence.E015")
    assert "TOUCH_INTERVAL" in error.msg and "ONLINE_WINDOW" in error.msg
    assert "well below" in (error.hint or "")


@pytest.mark.parametrize(
    "conf",
    [
        {"ONLINE_WINDOW": 2, "TOUCH_INTERVAL": 1},
        {"ONLINE_WINDOW": 31},
        {"TOUCH_INTERVAL": 299},
    ],
)
def test_e015_absent_when_touch_interval_is_below_online_window(
    settings: Any, conf: dict[str, int]
) -> None:
    settings.PRESENCE = conf
    assert ids(checks.check_settings) == []


def test_e015_leaves_bad_values_to_e002(settings: Any) -> None:
    settings.PRESENCE = {"ONLINE_WINDOW": 0, "TOUCH_INTERVAL": 30}
    assert ids(checks.check_settings) == ["presence.E002"]


# --- E004 / E005: the cache presence uses ------------------------------------------------------


def redis_cache(location: Any = "redis://127.0.0.1:6379/0") -> dict[str, Any]:
    return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": location}


def test_e004_cache_alias_missing_from_caches(settings: Any) -> None:
    settings.PRESENCE = {"CACHE_ALIAS": "presence"}
    assert ids(checks.check_cache) == ["presence.E004"]
    assert "'presence'" in messages_with("presence.E004")[0].msg

    settings.CACHES = {**settings.CACHES, "presence": redis_cache()}
    assert ids(checks.check_cache) == []


def test_e004_default_alias_missing(settings: Any) -> None:
    settings.CACHES = {"other": redis_cache()}
    assert ids(checks.check_cache) == ["presence.E004"]


@pytest.mark.parametrize(
    "backend",
    [
        "django.core.cache.backends.locmem.LocMemCache",
        "django.core.cache.backends.dummy.DummyCache",
        "django.core.cache.backends.redis.RedisCache",
    ],
)
def test_e005_cache_is_not_django_redis(settings: Any, backend: str) -> None:
    settings.CACHES = {"default": {**redis_cache(), "BACKEND": backend}}
    assert ids(checks.check_cache) == ["presence.E005"]
    assert backend in messages_with("presence.E005")[0].msg


@pytest.mark.parametrize(
    "location",
    [
        "127.0.0.1:6379",
        "",
        None,
        [],
        "memcached://x:11211",
        "redis://[::1:6379/0",
        "redis://127.0.0.1:abc/7",
        "redis://127.0.0.1:99999/7",
        "redis://127.0.0.1:6379/x",
    ],
)
def test_e005_location_is_not_a_redis_url(settings: Any, location: Any) -> None:
    # The store builds its own clients from this URL; anything else fails on every request.
    settings.CACHES = {"default": redis_cache(location)}
    assert ids(checks.check_cache) == ["presence.E005"]


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        ("redis://127.0.0.1:6379/x", "names database 'x', which is not a number"),
        ("memcached://x:11211", "is not a redis://, rediss:// or unix:// URL"),
        ("redis://127.0.0.1:abc/7", "its host or port cannot be read"),
        (["redis://primary:6379/x", "redis://replica:6379/0"], "'redis://primary:6379/x'"),
    ],
)
def test_e005_says_why_the_location_is_refused(settings: Any, location: Any, reason: str) -> None:
    settings.CACHES = {"default": redis_cache(location)}
    (message,) = messages_with("presence.E005")
    assert reason in message.msg


@pytest.mark.parametrize(
    "location",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://cache.example.com:6380/1",
        "unix:///run/redis.sock?db=0",
        ["redis://primary:6379/0", "redis://replica:6379/0"],
        "redis://primary:6379/0,redis://replica:6379/0",
    ],
)
def test_e005_absent_for_django_redis_with_a_redis_url(settings: Any, location: Any) -> None:
    settings.CACHES = {"default": redis_cache(location)}
    assert ids(checks.check_cache) == []


# --- E006 / E007: the middleware ---------------------------------------------------------------


def test_e006_middleware_missing(settings: Any) -> None:
    settings.MIDDLEWARE = [SESSIONS, AUTH]
    assert ids(checks.check_middleware) == ["presence.E006"]
    settings.MIDDLEWARE = [SESSIONS, AUTH, MIDDLEWARE]
    assert ids(checks.check_middleware) == []


@pytest.mark.parametrize(
    "middleware",
    [[SESSIONS, MIDDLEWARE, AUTH], [MIDDLEWARE, SESSIONS, AUTH], [SESSIONS, MIDDLEWARE]],
)
def test_e007_middleware_before_or_without_authentication(
    settings: Any, middleware: list[str]
) -> None:
    settings.MIDDLEWARE = middleware
    assert ids(checks.check_middleware) == ["presence.E007"]


def test_e007_absent_when_after_authentication(settings: Any) -> None:
    settings.MIDDLEWARE = [SESSIONS, AUTH, "x.Other", MIDDLEWARE]
    assert ids(checks.check_middleware) == []


# --- E014: time zone support ------------------------------------------------------------------


def test_e014_without_time_zone_support(settings: Any) -> None:
    settings.USE_TZ = False
    assert ids(checks.check_time_zone_support) == ["presence.E014"]


def test_e014_absent_with_time_zone_support(settings: Any) -> None:
    settings.USE_TZ = True
    assert ids(checks.check_time_zone_support) == []


# --- E008: the user model's primary key --------------------------------------------------------
# Models in an isolated registry stand in for AUTH_USER_MODEL: the check reads the model that
# get_user_model() returns, and swapping the real user model needs migrations of its own.


@isolate_apps("presence")
def user_models() -> dict[str, type[models.Model]]:
    class StandIn(models.Model):
        class Meta:
            abstract = True
            app_label = "presence"

        def __str__(self) -> str:
            return str(self.pk)

    class IntUser(StandIn):
        pass

    class BigIntUser(StandIn):
        id = models.BigAutoField(primary_key=True)

    class PositiveIntUser(StandIn):
        id = models.PositiveIntegerField(primary_key=True)

    class ChildUser(IntUser):  # multi-table inheritance: pk is a one-to-one to IntUser
        pass

    class CharUser(StandIn):
        username = models.CharField(max_length=150, primary_key=True)

    class UUIDUser(StandIn):
        id = models.UUIDField(primary_key=True, default=uuid.uuid4)

    class CharChildUser(CharUser):
        pass

    class UUIDChildUser(UUIDUser):
        pass

    class CompositeUser(StandIn):
        pk = models.CompositePrimaryKey("tenant", "number")
        tenant = models.CharField(max_length=20)
        number = models.IntegerField()

    class DateUser(StandIn):
        day = models.DateField(primary_key=True)

    stand_ins = (
        IntUser,
        BigIntUser,
        PositiveIntUser,
        ChildUser,
        CharUser,
        UUIDUser,
        CharChildUser,
        UUIDChildUser,
        CompositeUser,
        DateUser,
    )
    return {model.__name__: model for model in stand_ins}


USER_MODELS = user_models()


def use_user_model(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr("django.contrib.auth.get_user_model", lambda: USER_MODELS[name])


@pytest.mark.parametrize("name", ["CompositeUser", "DateUser"])
def test_e008_a_pk_presence_cannot_key_by(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    use_user_model(monkeypatch, name)
    assert ids(checks.check_user_model) == ["presence.E008"]


@pytest.mark.parametrize(
    "name",
    [
        "IntUser",
        "BigIntUser",
        "PositiveIntUser",
        "ChildUser",
        "CharUser",
        "UUIDUser",
        "CharChildUser",
        "UUIDChildUser",
    ],
)
def test_e008_absent_for_integer_uuid_and_string_pks(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    use_user_model(monkeypatch, name)
    assert ids(checks.check_user_model) == []


def test_e008_absent_for_the_real_user_model() -> None:
    assert ids(checks.check_user_model) == []


# --- W002: no channels_redis layer -------------------------------------------------------------


@pytest.mark.parametrize(
    "layers",
    [
        None,
        {},
        {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}},
        {"other": {"BACKEND": "channels_redis.core.RedisChannelLayer"}},
        # an entry that is no dict is no layer either (it raised AttributeError)
        {"default": None},
        {"default": "channels_redis.core.RedisChannelLayer"},
        [],
    ],
)
def test_w002_without_a_default_channels_redis_layer(settings: Any, layers: Any) -> None:
    settings.CHANNEL_LAYERS = layers
    (warning,) = checks.check_channel_layer()
    assert warning.id == "presence.W002"
    assert "one process" in warning.msg or "the process" in warning.msg
    assert "channels_redis" in (warning.hint or "")


@pytest.mark.parametrize(
    "backend",
    ["channels_redis.core.RedisChannelLayer", "channels_redis.pubsub.RedisPubSubChannelLayer"],
)
def test_w002_absent_for_a_channels_redis_layer(settings: Any, backend: str) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": backend, "CONFIG": {"hosts": []}}}
    assert checks.check_channel_layer() == []


# --- W006: a resume window too short for fresh stamps -------------------------------------------


def test_w006_resume_window_within_four_heartbeats(settings: Any) -> None:
    settings.PRESENCE = {"HEARTBEAT_INTERVAL": 30, "RESUME_WINDOW": 120}
    assert ids(checks.check_settings) == ["presence.W006"]
    (warning,) = messages_with("presence.W006")
    assert "RESUME_WINDOW" in warning.msg and "124" in (warning.hint or "")
    settings.PRESENCE = {"HEARTBEAT_INTERVAL": 30, "RESUME_WINDOW": 125}
    assert ids(checks.check_settings) == []
    settings.PRESENCE = {"HEARTBEAT_INTERVAL": 80}  # the default window, 300
    assert ids(checks.check_settings) == ["presence.W006"]


# --- W001: unknown keys ------------------------------------------------------------------------


def test_w001_unknown_key(settings: Any) -> None:
    settings.PRESENCE = {"ONLINE_WINDOWS": 300, "ONLINE_WINDOW": 300}
    assert ids(checks.check_settings) == ["presence.W001"]
    (warning,) = messages_with("presence.W001")
    assert "'ONLINE_WINDOWS'" in warning.msg and "ONLINE_WINDOW" in (warning.hint or "")


def test_w001_one_warning_per_unknown_key_of_any_type(settings: Any) -> None:
    settings.PRESENCE = {"online_window": 300, 5: "x", ("A",): 1}
    assert ids(checks.check_settings) == ["presence.W001"] * 3


def test_w001_absent_for_known_keys(settings: Any) -> None:
    settings.PRESENCE = {"ONLINE_WINDOW": 120, "TOUCH_INTERVAL": 15, "RATE_LIMIT": [30, 5]}
    assert ids() == []


# --- E002 for the live layer's settings --------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "default"), [("MAX_FRAME_BYTES", 65536), ("SWEEP_BATCH", 500), ("OPENINGS_AT_ONCE", 24)]
)
@pytest.mark.parametrize("bad", [0, -1, "500", 1.5, 2.0, True, None])
def test_e002_live_counts_must_be_positive_ints(
    settings: Any, key: str, default: int, bad: Any
) -> None:
    settings.PRESENCE = {key: bad}
    assert ids(checks.check_settings) == ["presence.E002"]
    (message,) = messages_with("presence.E002")
    assert message.msg == (
        f"PRESENCE[{key!r}] is {bad!r}; it must be a positive integer (seconds or a count)."
    )
    assert message.hint == f"Fix or remove PRESENCE[{key!r}] (default: {default!r})."


@pytest.mark.parametrize(
    ("key", "default"),
    [
        ("COALESCE_WINDOW", 0.2),
        ("SWEEP_INTERVAL", 1.0),
        ("OPENING_HOLD", 2.0),
        ("SOCKET_TIMEOUT", 0.5),
    ],
)
# NaN and infinity: float(os.environ[...]) gives them; each made every page a 500.
@pytest.mark.parametrize("bad", [0, 0.0, -0.5, "0.2", False, None, [1], float("nan"), float("inf")])
def test_e002_live_intervals_must_be_positive_numbers(
    settings: Any, key: str, default: float, bad: Any
) -> None:
    settings.PRESENCE = {key: bad}
    assert ids(checks.check_settings) == ["presence.E002"]
    (message,) = messages_with("presence.E002")
    assert message.msg == (
        f"PRESENCE[{key!r}] is {bad!r}; it must be a positive, finite number of seconds."
    )
    assert message.hint == f"Fix or remove PRESENCE[{key!r}] (default: {default!r})."


@pytest.mark.parametrize(
    "conf",
    [
        {"MAX_FRAME_BYTES": 1},
        {"MAX_FRAME_BYTES": 1_048_576},
        {"SWEEP_BATCH": 1},
        {"COALESCE_WINDOW": 0.05},
        {"COALESCE_WINDOW": 2},
        {"SWEEP_INTERVAL": 0.25},
        {"SWEEP_INTERVAL": 5},
        {"MAX_FRAME_BYTES": 4096, "SWEEP_BATCH": 100, "COALESCE_WINDOW": 1, "SWEEP_INTERVAL": 1},
        {"OPENINGS_AT_ONCE": 1, "OPENING_HOLD": 0.5},
    ],
)
def test_e002_absent_for_good_live_settings(settings: Any, conf: dict[str, Any]) -> None:
    settings.PRESENCE = conf
    assert ids() == []


def test_e002_reports_each_bad_live_setting(settings: Any) -> None:
    settings.PRESENCE = {
        "MAX_FRAME_BYTES": 0,
        "SWEEP_BATCH": "500",
        "COALESCE_WINDOW": -1,
        "SWEEP_INTERVAL": None,
    }
    assert ids(checks.check_settings) == ["presence.E002"] * 4
    reported = {m.msg.split("]")[0] + "]" for m in messages_with("presence.E002")}
    assert reported == {
        "PRESENCE['MAX_FRAME_BYTES']",
        "PRESENCE['SWEEP_BATCH']",
        "PRESENCE['COALESCE_WINDOW']",
        "PRESENCE['SWEEP_INTERVAL']",
    }


def test_live_settings_are_known_keys(settings: Any) -> None:
    settings.PRESENCE = {"MAX_FRAME_BYTES": 100, "SWEEP_BATCHES": 10}
    assert ids(checks.check_settings) == ["presence.W001"]
    (warning,) = messages_with("presence.W001")
    assert "'SWEEP_BATCHES'" in warning.msg
    for key in ("MAX_FRAME_BYTES", "COALESCE_WINDOW", "SWEEP_INTERVAL", "SWEEP_BATCH"):
        assert key in (warning.hint or "")


# --- E002 / W003: the HTTP rate limit and lengths beyond the database columns ------------------


@pytest.mark.parametrize("key", ["HTTP_RATE_LIMIT", "HTTP_READ_LIMIT"])
@pytest.mark.parametrize("bad", [(30,), (30, 0), (0, 60), ("30", "60"), (True, 60), "30/60", 30])
def test_e002_http_rate_limit_must_be_a_pair_of_positive_ints(
    settings: Any, key: str, bad: Any
) -> None:
    settings.PRESENCE = {key: bad}
    assert ids(checks.check_settings) == ["presence.E002"]
    assert key in messages_with("presence.E002")[0].msg


@pytest.mark.parametrize("key", ["HTTP_RATE_LIMIT", "HTTP_READ_LIMIT"])
@pytest.mark.parametrize("good", [(30, 60), [5, 1], None])
def test_e002_absent_for_an_http_rate_limit_pair_or_none(
    settings: Any, key: str, good: Any
) -> None:
    settings.PRESENCE = {key: good}
    assert ids(checks.check_settings) == []


def test_w003_length_settings_beyond_the_columns(settings: Any) -> None:
    # UserStatus.text and .activity hold 255 characters, .emoji 32 (read from the model).
    settings.PRESENCE = {"TEXT_MAX_LENGTH": 255, "EMOJI_MAX_LENGTH": 32}
    assert ids(checks.check_settings) == []
    settings.PRESENCE = {"TEXT_MAX_LENGTH": 256, "EMOJI_MAX_LENGTH": 33}
    assert ids(checks.check_settings) == ["presence.W003"] * 3
    found = messages_with("presence.W003")
    named = {
        column for m in found for column in ("text", "activity", "emoji") if f"'{column}'" in m.msg
    }
    assert named == {"text", "activity", "emoji"}
    assert all(m.hint and "at most" in m.hint for m in found)


# --- presence.W004: the request context processor ------------------------------------------


def test_w004_without_the_request_context_processor(settings: Any) -> None:
    engine = settings.TEMPLATES[0]
    processors = [
        name
        for name in engine["OPTIONS"]["context_processors"]
        if name != checks.REQUEST_CONTEXT_PROCESSOR
    ]
    settings.TEMPLATES = [
        {**engine, "OPTIONS": {**engine["OPTIONS"], "context_processors": processors}}
    ]
    [message] = checks.check_request_context_processor()
    assert message.id == "presence.W004"
    assert checks.REQUEST_CONTEXT_PROCESSOR in message.hint


def test_w004_absent_when_an_engine_has_it(settings: Any) -> None:
    assert (
        checks.REQUEST_CONTEXT_PROCESSOR in settings.TEMPLATES[0]["OPTIONS"]["context_processors"]
    )
    assert checks.check_request_context_processor() == []


@pytest.mark.parametrize(
    "value",
    [
        "redis://127.0.0.1:7000",  # a string, not a list
        [],
        ["http://127.0.0.1:7000"],
        ["redis://:7000"],
        ["redis://127.0.0.1"],
        ["redis://127.0.0.1:7000/2"],
        ["redis://127.0.0.1:notaport"],
        ["redis://127.0.0.1:7000", 7001],
    ],
)
def test_e009_malformed_redis_cluster(settings: Any, value: Any) -> None:
    settings.PRESENCE = {"REDIS_CLUSTER": value}
    assert ids() == ["presence.E009"]


@pytest.mark.parametrize(
    "value",
    [
        ["redis://127.0.0.1:7000"],
        ("rediss://user:secret@10.0.0.1:7000", "redis://10.0.0.2:7000/0"),
    ],
)
def test_e009_startup_node_urls_pass_and_no_cache_is_needed(settings: Any, value: Any) -> None:
    settings.PRESENCE = {"REDIS_CLUSTER": value, "CACHE_ALIAS": "missing"}
    assert ids() == []


#: each case: the setting, and the secrets it holds (none may be printed)
SECRET_CLUSTERS = {
    "user-and-password-bad-port": (["redis://user:secret@host:1/2"], ["secret"]),
    "password-only-no-port": (["redis://:secret@host"], ["secret"]),
    "a-string-not-a-list": ("redis://:secret@host:1", ["secret"]),
    "wrong-scheme": (["http://user:secret@host:1"], ["secret"]),
    # urlsplit cuts the password at "/", so the port it fails on is a piece of the password
    "slash-in-password": (["redis://user:se/cret@host:1"], ["se/cret", "'se'"]),
    "in-the-query": (["redis://host?password=secret"], ["secret"]),
    "a-later-url": (["redis://host:1", "redis://u:secret@other"], ["secret"]),
}


@pytest.mark.parametrize(("value", "secrets"), SECRET_CLUSTERS.values(), ids=SECRET_CLUSTERS.keys())
def test_e009_never_prints_the_password_of_a_url(
    settings: Any, value: Any, secrets: list[str]
) -> None:
    settings.PRESENCE = {"REDIS_CLUSTER": value}
    (message,) = messages_with("presence.E009")
    printed = f"{message.msg}\n{message.hint}\n{message}"
    for secret in secrets:
        assert secret not in printed
    assert "host" in printed  # still says which URL is wrong


def test_e005_never_prints_the_password_of_a_location(settings: Any) -> None:
    settings.CACHES = {"default": redis_cache("http://user:secret@cache.example.com:6379")}
    (message,) = messages_with("presence.E005")
    assert "secret" not in str(message)
    assert "cache.example.com" in message.msg


# --- presence.W005: SQLite under an ASGI server ------------------------------------------------

SQLITE = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/site/db.sqlite3"}
ASGI = "mysite.asgi.application"


def test_w005_sqlite_under_asgi_without_the_options() -> None:
    [message] = database_checks.sqlite_warnings(ASGI, SQLITE)
    assert message.id == "presence.W005"
    assert "timeout" in message.msg and "IMMEDIATE" in message.msg and "WAL" in message.msg
    assert message.hint is not None
    assert "'transaction_mode': 'IMMEDIATE'" in message.hint
    assert "PRAGMA journal_mode=WAL" in message.hint and "'timeout': 20" in message.hint


def test_w005_names_only_what_is_missing_and_keeps_the_sites_options() -> None:
    options = {"timeout": 60, "init_command": "PRAGMA cache_size=2000"}
    [message] = database_checks.sqlite_warnings(ASGI, {**SQLITE, "OPTIONS": options})
    assert "timeout" not in message.msg and "IMMEDIATE" in message.msg and "WAL" in message.msg
    assert database_checks.suggested_options(options) == {
        "timeout": 60,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA cache_size=2000; PRAGMA journal_mode=WAL;",
    }


def test_w005_absent_with_the_options_without_asgi_or_on_another_database() -> None:
    good = {**SQLITE, "OPTIONS": dict(database_checks.SQLITE_OPTIONS)}
    assert database_checks.sqlite_warnings(ASGI, good) == []
    assert database_checks.sqlite_warnings(None, SQLITE) == []
    assert database_checks.sqlite_warnings(ASGI, {**SQLITE, "NAME": ":memory:"}) == []
    postgres = {"ENGINE": "django.db.backends.postgresql", "NAME": "site"}
    assert database_checks.sqlite_warnings(ASGI, postgres) == []


def test_w005_reaches_django_and_the_demo_options_pass_it(settings: Any) -> None:
    settings.ASGI_APPLICATION = ASGI
    database = settings.DATABASES["default"]
    on_sqlite = database["ENGINE"].endswith("sqlite3")
    # The demo's options (the test settings keep DEFERRED: tests/settings/base.py says why).
    settings.DATABASES = {
        **settings.DATABASES,
        "default": {**database, "OPTIONS": dict(database_checks.SQLITE_OPTIONS)},
    }
    assert [m for m in run_checks() if m.id == "presence.W005"] == []
    settings.DATABASES = {**settings.DATABASES, "default": {**database, "OPTIONS": {}}}
    found = [m.id for m in run_checks() if m.id == "presence.W005"]
    assert found == (["presence.W005"] if on_sqlite else [])
    assert database_checks.check_sqlite_under_asgi in registry.registry.get_checks()
