"""The activity feed's settings, with their defaults: one optional dict ``PRESENCE_FEED``.

Read once and cached; the cache is cleared when ``PRESENCE_FEED`` changes (``override_settings``).
Validation lives in :mod:`presence.feed.checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver


@dataclass(frozen=True)
class FeedSettings:
    #: longest activity (post) text, in characters
    ACTIVITY_MAX_LENGTH: int = 500
    #: record each change of a user's custom status text as an activity of kind "status"
    RECORD_STATUS_ACTIVITIES: bool = False
    #: URL name reversed with a username as its one argument to link ``@username`` mentions
    #: (e.g. "accounts:profile"); None: the user's get_absolute_url() (ABSOLUTE_URL_OVERRIDES),
    #: else the mention is not linked
    MENTION_URL: str | None = None
    #: the user model's field holding each user's public handle, what ``@handle`` mentions,
    #: mention suggestions, feed JSON ("username") and mention links use; None: USERNAME_FIELD.
    #: A handle containing "@" (an e-mail address) is never shown, mentioned or suggested
    HANDLE_FIELD: str | None = None
    #: dotted path of ``can_read(user, feed) -> bool``: whether ``user`` may read the timeline
    #: named ``feed`` (``following``, ``mentions``, ``user:<id>``, ``group:<slug>``), asked by
    #: the feed's endpoints and by ``watch_feed``; a refusal looks like a timeline that does not
    #: exist. None: every timeline is open (each activity still shown by its author's privacy)
    CAN_READ: str | None = None


SETTING_NAMES = frozenset(f.name for f in fields(FeedSettings))


def user_settings() -> Any:
    return getattr(django_settings, "PRESENCE_FEED", {})


@cache
def get_settings() -> FeedSettings:
    raw = user_settings()
    if not isinstance(raw, dict):
        # presence_feed.E001 reports this; run on defaults meanwhile.
        return FeedSettings()
    return FeedSettings(**{key: value for key, value in raw.items() if key in SETTING_NAMES})


@receiver(setting_changed)
def _clear_on_change(*, setting: str, **kwargs: object) -> None:
    if setting == "PRESENCE_FEED":
        get_settings.cache_clear()
