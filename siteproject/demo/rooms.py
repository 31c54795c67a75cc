"""The demo's room rules (``PRESENCE["ROOMS"]`` in siteproject/settings.py): who may enter.

``post:<pk>``: whoever may read the post (the feed's rule: its author's ``activity_visibility``
and blocks). ``group:<slug>``: the group's members. Each is asked on every join and HTTP read.
"""

from __future__ import annotations

from typing import Any

from presence.feed import api as feed
from presence.feed.models import Activity, Membership


def can_read_post(user: Any, room_id: str) -> bool:
    if not room_id.isdigit():
        return False
    activity = Activity.objects.filter(pk=int(room_id)).first()
    return activity is not None and feed.can_see(user, activity)


def is_group_member(user: Any, room_id: str) -> bool:
    return Membership.objects.filter(group__slug=room_id, user=user.pk).exists()
