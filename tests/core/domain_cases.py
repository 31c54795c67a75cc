"""The cases the domain's tests share (tests/core/test_domain.py, test_domain_live.py)."""

from __future__ import annotations

from typing import Any

from presence import domain
from presence.domain import Choices, Presence, Relation, Status, Visibility

NOW = 1_800_000_000.0
LIMITS = domain.Limits(text_max_length=10, emoji_max_length=4, max_expiry=3600)
CONTACT = Relation(is_contact=True)
CLOSE = Relation(is_contact=True, is_close_friend=True)
STRANGER = Relation()
BLOCKED_CONTACT = Relation(is_contact=True, is_close_friend=True, blocked=True)


def everyone(**extra: object) -> Choices:
    return Choices(
        online_visibility=Visibility.EVERYONE,
        last_seen_visibility=Visibility.EVERYONE,
        activity_visibility=Visibility.EVERYONE,
        **extra,  # type: ignore[arg-type]
    )


# --- for test_domain_live.py (the live layer: connections, idle, news, WebSocket frames) ----


def online(**fields: Any) -> Presence:
    return Presence(status=Status.ONLINE, devices=("web",), **fields)
