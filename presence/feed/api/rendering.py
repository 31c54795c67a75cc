"""Rendering: an activity's text as HTML with its mentions linked, the JSON shape of activities
and pages, and mention completion."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef
from django.db.models.functions import Lower
from django.urls import NoReverseMatch, reverse
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from presence import domain
from presence.domain import UserId
from presence.feed import domain as feed_domain
from presence.feed.api.posting import handle_field, handle_of, mentions_of
from presence.feed.api.timelines import Page
from presence.feed.conf import get_settings
from presence.feed.models import Activity
from presence.models import Block
from presence.users import viewer_pk as _viewer_pk_of

logger = logging.getLogger("presence")


def profile_url(user: Any, url_name: str | None = None) -> str | None:
    """Where a mention of ``user`` links to: ``url_name`` (or ``MENTION_URL``) reversed with the
    username, else the user's ``get_absolute_url()``, else None (not linked)."""
    name = url_name or get_settings().MENTION_URL
    if name:
        try:
            handle = handle_of(user)
            return reverse(name, args=[handle]) if handle else None
        except NoReverseMatch:
            logger.warning("Presence: cannot reverse %r for a mention link", name)
            return None
    absolute = getattr(user, "get_absolute_url", None)
    return absolute() if callable(absolute) else None


def _recorded(spans: Any, text: str) -> list[tuple[int, int]]:
    """The ``[start, end]`` pairs of a mention's ``spans`` that fit ``text`` (an ``@`` and a
    name inside it); anything else is skipped."""
    fitting = []
    for pair in spans if isinstance(spans, list) else []:
        if isinstance(pair, list) and len(pair) == 2 and all(type(n) is int for n in pair):
            start, end = pair
            if 0 <= start < end <= len(text) and text[start] == "@":
                fitting.append((start, end))
    return fitting


def _mention_spans(activity: Activity) -> list[feed_domain.MentionSpan[Any]]:
    """Where the activity's stored mentions are in its text, in text order: the places recorded
    when it was posted; for a mention without them (see Mention.spans), its user's handle
    wherever the text names it, among the stored mentions only."""
    text = activity.text
    spans: list[feed_domain.MentionSpan[Any]] = []
    unplaced: list[tuple[str, Any]] = []
    for mention in mentions_of(activity):
        if mention.spans is None:
            if (handle := handle_of(mention.user)) is not None:
                unplaced.append((handle, mention.user))
            continue
        for start, end in _recorded(mention.spans, text):
            spans.append(feed_domain.MentionSpan(start, end, mention.user))
    if unplaced:
        spans += feed_domain.resolve_mentions(text, feed_domain.handle_lookup(unplaced))
    kept: list[feed_domain.MentionSpan[Any]] = []
    for span in sorted(spans, key=lambda span: (span.start, -span.end)):
        if not kept or span.start >= kept[-1].end:  # overlapping places: the first one
            kept.append(span)
    return kept


def render_text(activity: Activity, url_name: str | None = None) -> SafeString:
    """The activity's text as HTML: escaped, each stored mention linked to its user's profile
    (``<a class="mention" href="...">@name</a>``, or a ``<span class="mention">`` when there
    is no URL) where the post named them. Names that named nobody when posted stay plain text.
    No query beyond the mentions (loaded with the page)."""
    text = activity.text
    parts: list[str] = []
    start = 0
    for span in _mention_spans(activity):
        parts.append(escape(text[start : span.start]))
        label = text[span.start : span.end]
        url = profile_url(span.target, url_name)
        if url is None:
            parts.append(format_html('<span class="mention">{}</span>', label))
        else:
            parts.append(format_html('<a class="mention" href="{}">{}</a>', url, label))
        start = span.end
    parts.append(escape(text[start:]))
    return mark_safe("".join(parts))  # every part is escaped above


def json_id(pk: UserId) -> int | str:
    """A user id in JSON: an integer as a number, a UUID or string pk as its text."""
    return pk if isinstance(pk, int) else str(pk)


def activity_as_dict(activity: Activity, url_name: str | None = None) -> dict[str, Any]:
    """The JSON shape of an activity (the HTTP endpoints' ``ACTIVITY``)."""
    author = activity.author
    return {
        "id": activity.pk,
        "kind": activity.kind,
        "author": {"id": json_id(author.pk), "username": handle_of(author)},
        "text": activity.text,
        "html": str(render_text(activity, url_name)),
        "mentions": [
            {"id": json_id(mention.user.pk), "username": handle_of(mention.user)}
            for mention in mentions_of(activity)
        ],
        "created_at": domain.iso_time(activity.created_at),
    }


def page_as_dict(page: Page, url_name: str | None = None) -> dict[str, Any]:
    return {
        "activities": [activity_as_dict(activity, url_name) for activity in page.activities],
        "next_cursor": page.next_cursor,
    }


def usernames_starting_with(prefix: str, viewer: Any, limit: int = 10) -> list[Any]:
    """Users whose handle (``HANDLE_FIELD``) starts with ``prefix`` (ignoring case), for mention
    completion; users blocked either way, and handles that are e-mail addresses, are left
    out."""
    user_model = get_user_model()
    field = handle_field()
    viewer_pk = _viewer_pk_of(viewer)
    users = user_model._default_manager.filter(**{f"{field}__istartswith": prefix}).exclude(
        **{f"{field}__contains": "@"}
    )
    if "is_active" in {f.name for f in user_model._meta.get_fields()}:
        users = users.filter(is_active=True)
    if viewer_pk is not None:
        users = users.exclude(
            Exists(Block.objects.filter(blocker=OuterRef("pk"), blocked=viewer_pk))
        ).exclude(Exists(Block.objects.filter(blocker=viewer_pk, blocked=OuterRef("pk"))))
    return list(users.order_by(Lower(field), field)[:limit])
