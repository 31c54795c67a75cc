"""Display names and cards of a room's listed members, for the rooms' HTTP answer and template
tag.

``room_presence`` carries ids only (names are the site's, not presence's); the JSON endpoint and
``{% room_presence %}`` add each listed member's ``name`` and ``card`` (presence.api._cards), read
in one query. The members listed are those the viewer may see, so a name or a card reveals
nothing the list does not.
"""

from __future__ import annotations

from typing import Any

from presence.api._cards import cards_for_keys, display_name, unknown_card

__all__ = ["display_name", "with_names"]


def with_names(state: dict[str, Any]) -> dict[str, Any]:
    """The room state with a ``name`` and a ``card`` (``{"name", "avatar"}``) in each listed
    member (the id's text for a user deleted since they joined, so that the list still adds
    up to ``count``)."""
    members: dict[str, Any] = state.get("members") or {}
    cards = cards_for_keys(members)
    named = {}
    for key, member in members.items():
        card = cards.get(key) or unknown_card(key)
        named[key] = {**member, "name": card["name"], "card": card}
    return {**state, "members": named}
