"""System checks of the rooms' and the member cards' settings (presence.E011-E013), part of
``check_settings`` (presence.checks.settings). Ids are stable; each has a hint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.checks import CheckMessage, Error
from django.utils.module_loading import import_string

from presence.domain.rooms import is_valid_kind


def room_problems(raw: dict[str, Any]) -> list[CheckMessage]:
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
    except Exception as error:  # (".x" is a ValueError; a module may raise anything)
        return f"does not import ({type(error).__name__}: {error})"
    return None if callable(found) else f"names a {type(found).__name__}, not a function"


def card_problems(raw: dict[str, Any]) -> list[CheckMessage]:
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
