"""Display names of a room's listed members, for the rooms' HTTP answer and template tag.

Room frames and ``room_presence`` carry ids only (names are the site's, not presence's); the
JSON endpoint and ``{% room_presence %}`` add each listed member's name, read in one query. The
members listed are those the viewer may see, so a name reveals nothing the list does not.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model

from presence.users import parse_user_id


def display_name(user: Any) -> str:
    """The user's full name where the user model has one, else the username."""
    full_name = getattr(user, "get_full_name", None)
    name = full_name() if callable(full_name) else ""
    return str(name or "").strip() or str(user.get_username())


def member_names(keys: Iterable[str]) -> dict[str, str]:
    """``{key: display name}`` for the members' keys of a room state (their ids as text), in
    one query; keys of no user are left out."""
    pks: dict[Any, str] = {}
    for key in keys:
        try:
            pks[parse_user_id(key)] = key
        except ValueError:
            continue
    if not pks:
        return {}
    found = get_user_model()._default_manager.filter(pk__in=list(pks))
    return {pks[user.pk]: display_name(user) for user in found if user.pk in pks}


def with_names(state: dict[str, Any]) -> dict[str, Any]:
    """The room state with a ``name`` in each listed member (the id's text for a user deleted
    since they joined, so that the list still adds up to ``count``)."""
    members: dict[str, Any] = state.get("members") or {}
    names = member_names(members)
    named = {key: {**member, "name": names.get(key, key)} for key, member in members.items()}
    return {**state, "members": named}
