"""Member cards (``card(user)``) for the cards tests: named in PRESENCE["MEMBER_CARD"] by dotted
path. ``calls`` records the users each call was for (the database thread of the live tests and
the test's own thread share it)."""

from __future__ import annotations

from typing import Any

calls: list[Any] = []

CUSTOM = "tests.rooms.cards.with_avatar"


def with_avatar(user: Any) -> dict[str, Any]:
    calls.append(user.pk)
    return {"name": f"{user.username.title()} Card", "avatar": f"/media/{user.username}.png"}


def raises(user: Any) -> dict[str, Any]:
    raise RuntimeError("this site's cards are broken")


def odd(user: Any) -> Any:
    """Not a card: a name that is no string, an avatar that is no URL text."""
    return {"name": 7, "avatar": ["no"]}


NOT_CALLABLE = {"name": "x"}
