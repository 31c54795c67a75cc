"""Friends: mutual contacts with no block between them either way."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef

from presence.domain import UserId
from presence.models import Block, Contact
from presence.users import viewer_pk as viewer_id


def friends_query(user_pk: Any) -> Any:
    """Ids of mutual contacts of a user with no block between them either way, in one query:
    a blocked friend is no friend to show (not even hidden in a live list)."""
    them = OuterRef("contact")
    return (
        Contact.objects.filter(owner=user_pk)
        .filter(Exists(Contact.objects.filter(owner=them, contact=user_pk)))
        .filter(~Exists(Block.objects.filter(blocker=them, blocked=user_pk)))
        .filter(~Exists(Block.objects.filter(blocker=user_pk, blocked=them)))
        .values_list("contact_id", flat=True)
    )


def friend_ids(user: Any) -> list[UserId]:
    user_pk = viewer_id(user)
    return [] if user_pk is None else list(friends_query(user_pk))


async def afriend_ids(user: Any) -> list[UserId]:
    user_pk = viewer_id(user)
    return [] if user_pk is None else [pk async for pk in friends_query(user_pk)]
