# forum/rooms.py: the forum's own rule for its topics' rooms (docs/rooms.md, "Declaring rooms"):
# PRESENCE["ROOMS"] = {"topic": "tests.sites.forumsite.rooms.can_enter_topic"}.
from __future__ import annotations

from typing import Any

from django.db.models import Q

from tests.sites.forumsite.models import Topic


def can_enter_topic(user: Any, room_id: str) -> bool:
    """Whoever may read the topic: anyone signed in for a public one, its participants only for
    a private one (one query)."""
    if not room_id.isdigit():
        return False
    readable = Q(is_private=False) | Q(participants=user.pk)
    return Topic.objects.filter(readable, pk=int(room_id)).exists()
