"""System checks of ``PRESENCE``'s values (presence.E001-E003, E010, E015, W001, W003, W006; the
rooms' and member cards' values by :mod:`presence.checks.rooms`). Ids are stable; each has a
hint."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from django.apps import apps
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from presence import domain
from presence.checks.rooms import card_problems, room_problems
from presence.conf import (
    FEED_SETTING_NAMES,
    SETTING_NAMES,
    STAMP_SLACK,
    PresenceSettings,
    user_settings,
)

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
    "MAX_WATCHED_ROOMS",
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
    messages: list[CheckMessage] = _unknown_keys(raw)
    for key in _POSITIVE_INTS:
        if key in raw and not _is_positive_int(raw[key]):
            messages.append(_bad_value(key, raw[key], "a positive integer (seconds or a count)"))
    for key in _POSITIVE_NUMBERS:
        value = raw.get(key, 1)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)  # NaN compares false with anything; inf overflows
            or value <= 0
        ):
            messages.append(_bad_value(key, value, "a positive, finite number of seconds"))
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
    messages += room_problems(raw)
    messages += card_problems(raw)
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
    messages += _resume_window_problems(raw, heartbeat)
    messages += _touch_interval_problems(raw)
    return messages


def _unknown_keys(raw: dict[str, Any]) -> list[CheckMessage]:
    """presence.W001: a key presence does not know. A feed key left in PRESENCE is the feed's
    presence_feed.W002 when the feed is installed (one message, not two); without the feed it
    is W001, whose hint says where it belongs."""
    feed_installed = apps.is_installed("presence.feed")
    messages: list[CheckMessage] = []
    # repr: keys of mixed types (a typo'd int key beside str keys) must not break sorting.
    for key in sorted(set(raw) - SETTING_NAMES, key=repr):
        if key in FEED_SETTING_NAMES:
            if feed_installed:
                continue
            hint = (
                f"{key!r} is a setting of the activity feed: it belongs in PRESENCE_FEED, with "
                '"presence.feed" in INSTALLED_APPS; without the feed, remove it.'
            )
        else:
            hint = "Known keys: " + ", ".join(sorted(SETTING_NAMES)) + "."
        messages.append(
            Warning(
                f"PRESENCE has an unknown key {key!r}; it is ignored.",
                hint=hint,
                id="presence.W001",
            )
        )
    return messages


def _touch_interval_problems(raw: dict[str, Any]) -> list[CheckMessage]:
    """presence.E015: the middleware writes a browsing user once per TOUCH_INTERVAL, and a
    write counts for ONLINE_WINDOW; an interval not below the window leaves a user who keeps
    browsing offline from the window's end until the next write (user_offline and user_online
    every cycle)."""
    window = raw.get("ONLINE_WINDOW", PresenceSettings.ONLINE_WINDOW)
    touch = raw.get("TOUCH_INTERVAL", PresenceSettings.TOUCH_INTERVAL)
    if not (_is_positive_int(window) and _is_positive_int(touch)) or touch < window:
        return []  # a bad value is presence.E002's
    return [
        Error(
            f"PRESENCE['TOUCH_INTERVAL'] ({touch}) must be below PRESENCE['ONLINE_WINDOW'] "
            f"({window}): a user who keeps browsing (without presence.js) would show offline "
            "from ONLINE_WINDOW after each recorded page view until the next one is recorded.",
            hint="Keep TOUCH_INTERVAL well below ONLINE_WINDOW (the defaults are "
            f"{PresenceSettings.TOUCH_INTERVAL} and {PresenceSettings.ONLINE_WINDOW} seconds).",
            id="presence.E015",
        )
    ]


def _resume_window_problems(raw: dict[str, Any], heartbeat: Any) -> list[CheckMessage]:
    """W006: a fresh stamp (presence.consumers.restamping) is due at two heartbeats (at most
    half the window) and arrives up to two heartbeats later; a window not above four heartbeats
    (and the clocks' slack twice) lets a long-open page's stamp run out before its fresh one
    comes."""
    window = raw.get("RESUME_WINDOW", PresenceSettings.RESUME_WINDOW)
    if not (_is_positive_int(window) and _is_positive_int(heartbeat)):
        return []
    if window > 4 * heartbeat + 2 * STAMP_SLACK:
        return []
    return [
        Warning(
            f"PRESENCE['RESUME_WINDOW'] ({window}) is too short for HEARTBEAT_INTERVAL "
            f"({heartbeat}): a page's stamp may run out before its fresh stamp arrives, and a "
            "page open longer than RESUME_WINDOW then gets a full snapshot when it reconnects.",
            hint=f"Use a RESUME_WINDOW above {int(4 * heartbeat + 2 * STAMP_SLACK)} seconds "
            "(four heartbeat intervals and a few seconds); the default is 300.",
            id="presence.W006",
        )
    ]


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
