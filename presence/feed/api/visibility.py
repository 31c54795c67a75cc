"""Who may see what: an author's ``activity_visibility`` and blocks, the same rule as for custom
status (:func:`presence.domain.permits`), as a queryset filter (:func:`visible_to`, so paging
stays exact and index-backed) and for one activity (:func:`can_see`)."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db.models import Q

from presence import domain, privacy, relations
from presence.feed.models import Activity
from presence.users import viewer_pk as _viewer_pk_of


def visible_to(viewer: Any, author: str = "author") -> Q:
    """A filter keeping the rows whose author ``viewer`` may see activities of.

    ``author`` is the lookup of the author's user from the filtered model: ``"author"`` on
    Activity, ``"contact"`` on Contact, ``"user"`` on Membership, ``"activity__author"`` on
    Mention, ``"pk"`` on the user model. The rule is presence's (:mod:`presence.privacy`) for the
    author's ``activity_visibility``: the author always sees their own; a block in either
    direction hides; else ``everyone``, ``contacts``, ``close_friends`` or ``nobody`` decides.
    """
    return privacy.visible_to(viewer, owner_field=author, setting="activity_visibility")


def can_see(viewer: Any, activity: Activity) -> bool:
    """Whether ``viewer`` may see ``activity``: the rule of :func:`visible_to` for one item, as
    presence decides it for custom status (``presence.domain.permits``)."""
    viewer_pk = _viewer_pk_of(viewer)
    if viewer_pk is not None and viewer_pk == activity.author_id:
        return True
    # relations.load takes a user: an unsaved instance with the pk stands for an id.
    user = None if viewer_pk is None else get_user_model()(pk=viewer_pk)
    facts = relations.load(user, [activity.author_id])
    if activity.author_id not in facts:
        return False
    relation, choices = facts[activity.author_id]
    return domain.permits(choices.activity_visibility, relation, "activity_visibility")


async def acan_see(viewer: Any, activity: Activity) -> bool:
    return await sync_to_async(can_see)(viewer, activity)
