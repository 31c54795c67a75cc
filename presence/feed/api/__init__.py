"""The activity feed: posting with ``@mentions``, four timelines, groups, and who may see what.

Timelines are computed when they are read, from the graph as it is at that moment (``Contact``
for following, ``Membership`` for groups, ``Mention``) with joins and subqueries: nothing is
copied per follower or per group when an activity is posted, so following, unfollowing, joining
or leaving takes effect on the very next page, for all past activities.

Every timeline is newest first and paged by an opaque cursor, a keyset on ``(created_at, id)``:
a page starts strictly below the last activity of the page before, so activities posted while a
reader pages never cause duplicates or gaps.

Who may see an activity is its author's ``activity_visibility`` and blocks, the same rule as for
custom status (:func:`presence.domain.permits`), applied as a queryset filter
(:func:`visible_to`) so paging stays exact and index-backed; :func:`can_see` answers it for one
activity.

This module is the feed's public API; its parts, by concern: :mod:`.visibility`,
:mod:`.posting` (and an activity's mentions), :mod:`.groups`, :mod:`.timelines`,
:mod:`.rendering` (HTML and JSON), :mod:`.audience` (live timelines), :mod:`.watches` (live
watches asked ``CAN_READ`` again) and :mod:`.export` (a user's data). The receivers that
record status changes as activities are at the app's edge, in :mod:`presence.feed.receivers`.
"""

from __future__ import annotations

from presence.domain import InvalidInput
from presence.feed.api.audience import activities_after as activities_after
from presence.feed.api.audience import feed_exists as feed_exists
from presence.feed.api.audience import feed_key as feed_key
from presence.feed.api.audience import live_audience as live_audience
from presence.feed.api.audience import may_read
from presence.feed.api.export import aexport_user_data, export_user_data
from presence.feed.api.groups import is_member as is_member
from presence.feed.api.groups import join, leave
from presence.feed.api.posting import MAX_MENTION_NAMES as MAX_MENTION_NAMES
from presence.feed.api.posting import activity_posted, post
from presence.feed.api.posting import handle_field as handle_field
from presence.feed.api.posting import handle_of as handle_of
from presence.feed.api.posting import mentioned_users as mentioned_users
from presence.feed.api.posting import mentions_of as mentions_of
from presence.feed.api.rendering import activity_as_dict, render_text
from presence.feed.api.rendering import json_id as json_id
from presence.feed.api.rendering import page_as_dict as page_as_dict
from presence.feed.api.rendering import profile_url as profile_url
from presence.feed.api.rendering import usernames_starting_with as usernames_starting_with
from presence.feed.api.timelines import MAX_PAGE_SIZE as MAX_PAGE_SIZE
from presence.feed.api.timelines import (
    PAGE_SIZE,
    Page,
    following_timeline,
    group_timeline,
    mentions_timeline,
    user_timeline,
)
from presence.feed.api.visibility import acan_see, can_see, visible_to
from presence.feed.api.watches import arecheck_watches, recheck_watches
from presence.feed.models import Activity, Group

# The documented API. The names imported "as" themselves above are public too (the app's views,
# live timelines and template tags use them), but not part of `import *`, as before the split.
__all__ = [
    "PAGE_SIZE",
    "Activity",
    "Group",
    "InvalidInput",
    "Page",
    "acan_see",
    "activity_as_dict",
    "activity_posted",
    "aexport_user_data",
    "arecheck_watches",
    "can_see",
    "export_user_data",
    "following_timeline",
    "group_timeline",
    "join",
    "leave",
    "may_read",
    "mentions_timeline",
    "post",
    "recheck_watches",
    "render_text",
    "user_timeline",
    "visible_to",
]
