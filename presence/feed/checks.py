"""System checks of the activity feed's settings (``PRESENCE_FEED``). Ids are stable; each has
a hint."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db.models import F, UniqueConstraint
from django.utils.module_loading import import_string

from presence.conf import user_settings as presence_settings
from presence.feed.conf import SETTING_NAMES, FeedSettings, user_settings


def _bad_value(key: str, value: Any, expected: str) -> Error:
    return Error(
        f"PRESENCE_FEED[{key!r}] is {value!r}; it must be {expected}.",
        hint=f"Fix or remove PRESENCE_FEED[{key!r}] (default: {getattr(FeedSettings, key)!r}).",
        id="presence_feed.E002",
    )


def _makes_unique(constraint: Any, name: str) -> bool:
    """Whether ``constraint`` keeps field ``name`` unique on every row: a unique constraint on
    it alone, or on one expression of it alone (e.g. ``Lower(name)``)."""
    if not isinstance(constraint, UniqueConstraint) or constraint.condition is not None:
        return False
    if constraint.fields:
        return tuple(constraint.fields) == (name,)
    if len(constraint.expressions) != 1:
        return False
    [expression] = constraint.expressions
    flatten = getattr(expression, "flatten", None)
    parts = list(flatten()) if callable(flatten) else [expression]
    return {getattr(part, "name", None) for part in parts if isinstance(part, F)} == {name}


def _check_handle_field(name: str) -> list[CheckMessage]:
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    fields = {field.name: field for field in user_model._meta.concrete_fields}
    if name not in fields:
        return [
            Error(
                f"PRESENCE_FEED['HANDLE_FIELD'] is {name!r}, which is not a field of "
                f"{user_model._meta.label}.",
                hint="Name the user model's field of public handles (e.g. 'username' or "
                "'display_name'), or remove the key to use USERNAME_FIELD.",
                id="presence_feed.E003",
            )
        ]
    if fields[name].unique or any(
        _makes_unique(constraint, name) for constraint in user_model._meta.constraints
    ):
        return []
    return [
        Warning(
            f"PRESENCE_FEED['HANDLE_FIELD'] is {name!r}, which is not unique on "
            f"{user_model._meta.label}: users who share a handle cannot be mentioned by it "
            "(their @handle mentions nobody), and a link to one of their profiles by handle "
            "may open another's.",
            hint=f"Make {user_model._meta.label}.{name} unique (unique=True or a "
            "UniqueConstraint), or name a unique field.",
            id="presence_feed.W003",
        )
    ]


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    core = presence_settings()
    if isinstance(core, dict):
        # These keys were in PRESENCE before the feed became an app of its own.
        for key in sorted(SETTING_NAMES & set(core)):
            messages.append(
                Warning(
                    f"PRESENCE[{key!r}] is a setting of the activity feed; it is ignored there.",
                    hint=f"Move it to PRESENCE_FEED = {{{key!r}: ...}}.",
                    id="presence_feed.W002",
                )
            )
    raw = user_settings()
    if not isinstance(raw, dict):
        messages.append(
            Error(
                f"PRESENCE_FEED must be a dict, not {type(raw).__name__}.",
                hint='Set PRESENCE_FEED = {"ACTIVITY_MAX_LENGTH": 500, ...} or remove it for '
                "the defaults.",
                id="presence_feed.E001",
            )
        )
        return messages
    for key in sorted(set(raw) - SETTING_NAMES, key=repr):
        messages.append(
            Warning(
                f"PRESENCE_FEED has an unknown key {key!r}; it is ignored.",
                hint="Known keys: " + ", ".join(sorted(SETTING_NAMES)) + ".",
                id="presence_feed.W001",
            )
        )
    length = raw.get("ACTIVITY_MAX_LENGTH", 1)
    if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
        messages.append(_bad_value("ACTIVITY_MAX_LENGTH", length, "a positive integer"))
    if not isinstance(raw.get("RECORD_STATUS_ACTIVITIES", False), bool):
        value = raw["RECORD_STATUS_ACTIVITIES"]
        messages.append(_bad_value("RECORD_STATUS_ACTIVITIES", value, "True or False"))
    handle = raw.get("HANDLE_FIELD")
    if handle is not None:
        if not isinstance(handle, str) or not handle:
            messages.append(_bad_value("HANDLE_FIELD", handle, "a field name (a string) or None"))
        else:
            messages += _check_handle_field(handle)
    mention_url = raw.get("MENTION_URL")
    if mention_url is not None and (not isinstance(mention_url, str) or not mention_url):
        messages.append(_bad_value("MENTION_URL", mention_url, "a URL name (a string) or None"))
    rule = raw.get("CAN_READ")
    if rule is not None:
        if not isinstance(rule, str) or not rule:
            messages.append(_bad_value("CAN_READ", rule, "a dotted path (a string) or None"))
        else:
            messages += _check_rule(rule)
    return messages


def _check_rule(path: str) -> list[CheckMessage]:
    """presence_feed.E004: CAN_READ names no function (it does not import, or is not callable).
    Every timeline is refused until it is fixed."""
    try:
        found = import_string(path)
    except Exception as error:  # (".x" is a ValueError; a module may raise anything)
        problem = f"does not import ({type(error).__name__}: {error})"
    else:
        if callable(found):
            return []
        problem = f"names a {type(found).__name__}, not a function"
    return [
        Error(
            f"PRESENCE_FEED['CAN_READ'] = {path!r} {problem}; every timeline is refused (over "
            "HTTP and watch_feed) until it is fixed.",
            hint="Name a function can_read(user, feed) -> bool by its dotted path (e.g. "
            '"groups.rules.can_read_feed"), or remove the key to open every timeline.',
            id="presence_feed.E004",
        )
    ]
