# forum/cards.py: how a member is shown (docs/rooms.md, "Member cards"):
# PRESENCE["MEMBER_CARD"] = "tests.sites.forumsite.cards.member_card". The avatar is on the user
# row, so a card costs no query.
from __future__ import annotations

from typing import Any


def member_card(user: Any) -> dict[str, Any]:
    return {
        "name": user.get_full_name() or user.username,
        "avatar": user.avatar.url if user.avatar else None,
    }
