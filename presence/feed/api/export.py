"""A user's data in the activity feed (``export_user_data``; ``manage.py presence_export`` adds
it as ``"feed"``), JSON-ready, for data requests (GDPR's access and portability).

What is theirs: the activities they posted (with whom each mentions), their group memberships,
and the activities of others that mention them which they may see (as their mentions timeline
shows them: the author's ``activity_visibility`` and blocks). A mention in a post the user may
not see stays out, and is not counted either: its author chose to keep that post from them, and
telling that it exists (when, by whom) would give that away. Docs: docs/privacy.md, "Your
users' data"; docs/feed.md.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from presence import domain
from presence.feed.api.posting import _load_mentions, handle_of, mentions_of
from presence.feed.api.rendering import json_id
from presence.feed.api.visibility import visible_to
from presence.feed.models import Activity, Membership, Mention
from presence.users import user_pk


def _someone(user: Any) -> dict[str, Any]:
    # As the feed's JSON names people: an e-mail address as a handle is never shown.
    return {"id": json_id(user.pk), "username": handle_of(user)}


def _own(activity: Activity) -> dict[str, Any]:
    return {
        "id": activity.pk,
        "kind": activity.kind,
        "text": activity.text,
        "created_at": domain.iso_time(activity.created_at),
        # whom the user's own post mentions, in the text's order (the user named them)
        "mentions": [_someone(mention.user) for mention in mentions_of(activity)],
    }


def export_user_data(user: Any) -> dict[str, Any]:
    """What the feed holds about ``user`` (a user or a user id), JSON-ready:

    - ``activities``: what they posted, oldest first: ``id``, ``kind``, ``text``,
      ``created_at``, ``mentions`` (``[{"id", "username"}]``);
    - ``memberships``: their groups: ``group`` (the slug), ``name``, ``joined_at``;
    - ``mentions``: the activities of others that mention them and that they may see now,
      oldest first: ``activity``, ``author`` (``{"id", "username"}``), ``kind``, ``text``,
      ``created_at``. Mentions in activities hidden from them are left out (see the module).

    A few queries, each reading only this user's rows (by the (author, ...), (user, ...)
    indexes); for data requests, not request paths."""
    uid = user_pk(user)
    activities = list(Activity.objects.filter(author=uid).order_by("created_at", "pk"))
    _load_mentions(activities)
    memberships = (
        Membership.objects.filter(user=uid).select_related("group").order_by("joined_at", "pk")
    )
    mentions = (
        Mention.objects.filter(user=uid)
        .exclude(activity__author=uid)  # their own posts are above
        .filter(visible_to(uid, "activity__author"))
        .select_related("activity__author")
        .order_by("created_at", "activity_id")
    )
    return {
        "activities": [_own(activity) for activity in activities],
        "memberships": [
            {
                "group": membership.group.slug,
                "name": membership.group.name,
                "joined_at": domain.iso_time(membership.joined_at),
            }
            for membership in memberships
        ],
        "mentions": [
            {
                "activity": mention.activity_id,
                "author": _someone(mention.activity.author),
                "kind": mention.activity.kind,
                "text": mention.activity.text,
                "created_at": domain.iso_time(mention.activity.created_at),
            }
            for mention in mentions
        ],
    }


async def aexport_user_data(user: Any) -> dict[str, Any]:
    """:func:`export_user_data` for async code."""
    return await sync_to_async(export_user_data)(user)
