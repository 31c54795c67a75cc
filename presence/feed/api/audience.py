"""The audience of a new activity on live timelines (the WebSocket's ``watch_feed``, see
presence.feed.live): who of the watching viewers sees it on which feed, by the timelines' rules."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.utils.module_loading import import_string

from presence import domain, relations
from presence.domain import UserId
from presence.feed.api.posting import mentions_of
from presence.feed.api.rendering import activity_as_dict
from presence.feed.api.timelines import (
    PAGE_SIZE,
    Page,
    following_timeline,
    group_timeline,
    mentions_timeline,
    user_timeline,
)
from presence.feed.conf import get_settings
from presence.feed.domain import Position
from presence.feed.models import Activity, Group, Membership
from presence.models import Contact
from presence.users import parse_user_id

logger = logging.getLogger("presence")

#: paths of CAN_READ that did not import, logged once each
_TOLD: set[str] = set()


def feed_key(user_id: UserId) -> str:
    """A user's id in the name of their live timeline, ``user:<id>``: its canonical text (a
    UUID lowercase with hyphens)."""
    return str(user_id)


def feed_exists(feed: str) -> bool:
    """Whether a feed name (already valid in form, see domain.FEED_NAME) names a timeline."""
    kind, _, key = feed.partition(":")
    if kind == "user":
        try:
            pk: Any = parse_user_id(key)  # Any: the site's pk type (presence.users.user_pk)
        except ValueError:
            return False
        return get_user_model()._default_manager.filter(pk=pk).exists()
    if kind == "group":
        return Group.objects.filter(slug=key).exists()
    return True


def may_read(user: Any, feed: str) -> bool:
    """Whether ``user`` may read the timeline ``feed`` (a valid name: ``following``,
    ``mentions``, ``user:<id>``, ``group:<slug>``), by the site's ``PRESENCE_FEED["CAN_READ"]``
    (None: every timeline). A rule that raises refuses (the error is logged); a path that does
    not import refuses everyone (presence_feed.E004 reports it)."""
    path = get_settings().CAN_READ
    if path is None:
        return True
    rule = _rule(path)
    if rule is None:
        return False
    try:
        return bool(rule(user, feed))
    except Exception:
        logger.exception("Presence: PRESENCE_FEED['CAN_READ'] raised for %s; refused.", feed)
        return False


def _rule(path: str) -> Callable[[Any, str], Any] | None:
    try:
        found = import_string(path)
    except Exception:  # (not only ImportError: ".x" is a ValueError, a module may raise)
        found = None
    if callable(found):
        return found
    if path not in _TOLD:
        _TOLD.add(path)
        logger.error(
            "Presence: PRESENCE_FEED['CAN_READ'] = %r names no function; every timeline is "
            "refused (see the system check presence_feed.E004).",
            path,
        )
    return None


def activities_after(
    viewer: Any, feed: str, after: int, limit: int = PAGE_SIZE
) -> tuple[list[Activity], bool]:
    """The activities of timeline ``feed`` (a valid name) newer than activity ``after`` (0:
    all), as ``viewer`` reads the timeline (its own function: the same rules and privacy),
    oldest first: what a page that shows ``after`` as its newest has missed. At most
    ``limit``: with more, ``([], False)`` (the page must load the timeline again); else
    ``(activities, True)``. Newer means later in the timelines' (created_at, id) order; an
    ``after`` no longer stored (deleted) is placed by its id."""
    created_at = Activity.objects.filter(pk=after).values_list("created_at", flat=True).first()
    since = Position(created_at, after) if created_at is not None else None
    page = _first_page(viewer, feed, limit + 1)
    newer = [
        activity
        for activity in page.activities
        if (Position(activity.created_at, activity.pk) > since if since else activity.pk > after)
    ]
    # Complete when the page reached an activity not newer, or the timeline's end (a page
    # short of deletions read meanwhile has a cursor all the same: not known to be complete).
    reached = len(newer) < len(page.activities) or page.next_cursor is None
    if len(newer) > limit or not reached:
        return [], False
    return newer[::-1], True


def _first_page(viewer: Any, feed: str, limit: int) -> Page:
    kind, _, key = feed.partition(":")
    if feed == "following":
        # The live timeline sends the viewer's own activities too.
        return following_timeline(viewer, include_self=True, limit=limit)
    if feed == "mentions":
        return mentions_timeline(viewer, limit=limit)
    if kind == "user":
        return user_timeline(parse_user_id(key), viewer, limit=limit)
    group = Group.objects.filter(slug=key).first()
    return group_timeline(group, viewer, limit=limit) if group else Page([], None)


def live_audience(
    activity_id: int, watching: dict[UserId, set[str]], url_name: str | None = None
) -> tuple[dict[str, Any] | None, dict[UserId, list[str]]]:
    """Which of the ``watching`` viewers ({viewer id: feed names}) see a new activity on which
    of their feeds, by the same rules as the timelines and :func:`can_see`: the activity as
    JSON and {viewer id: [feeds]}. Five queries whatever the number of viewers."""
    activity = Activity.objects.select_related("author").filter(pk=activity_id).first()
    if activity is None or not watching:
        return None, {}
    author = activity.author_id
    viewers: set[Any] = set(watching)  # Any: the site's pk type (presence.users.user_pk)
    wanted = {feed for feeds in watching.values() for feed in feeds}
    followers = set(
        Contact.objects.filter(owner__in=viewers, contact=author).values_list("owner", flat=True)
    )
    slugs = {feed[6:] for feed in wanted if feed.startswith("group:")}
    groups = (
        set(
            Membership.objects.filter(user=author, group__slug__in=slugs).values_list(
                "group__slug", flat=True
            )
        )
        if slugs
        else set()
    )
    mentioned = {mention.user_id for mention in mentions_of(activity)}
    pairs = relations.load_pairs(viewers, [author])
    choices = pairs.choices.get(author)
    if choices is None:
        return None, {}
    audience: dict[UserId, list[str]] = {}
    for viewer, feeds in watching.items():
        if not domain.permits(
            choices.activity_visibility, pairs.relation(viewer, author), "activity_visibility"
        ):
            continue
        matched = [
            feed
            for feed in sorted(feeds)
            if (feed == "following" and (viewer in followers or viewer == author))
            or (feed == "mentions" and viewer in mentioned)
            or feed == f"user:{feed_key(author)}"
            or (feed.startswith("group:") and feed[6:] in groups)
        ]
        if matched:
            audience[viewer] = matched
    return (activity_as_dict(activity, url_name) if audience else None), audience
