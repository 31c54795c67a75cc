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
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import IntegrityError, router, transaction
from django.db.models import (
    Exists,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.functions import Lower
from django.db.models.signals import post_save, pre_save
from django.dispatch import Signal
from django.urls import NoReverseMatch, reverse
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from presence import domain, privacy, relations
from presence.domain import InvalidInput, UserId
from presence.feed import domain as feed_domain
from presence.feed.conf import get_settings
from presence.feed.domain import Position
from presence.feed.models import Activity, ActivityKind, Group, Membership, Mention
from presence.models import Block, Contact, UserStatus
from presence.users import parse_user_id
from presence.users import viewer_pk as _viewer_pk_of

__all__ = [
    "PAGE_SIZE",
    "Activity",
    "Group",
    "InvalidInput",
    "Page",
    "acan_see",
    "activity_as_dict",
    "activity_posted",
    "can_see",
    "following_timeline",
    "group_timeline",
    "join",
    "leave",
    "mentions_timeline",
    "post",
    "render_text",
    "user_timeline",
    "visible_to",
]

logger = logging.getLogger("presence")

#: Sent after commit when an activity was posted: ``activity`` (an Activity, author loaded).
#: Listeners decide per viewer with :func:`can_see` (or filter with :func:`visible_to`).
activity_posted = Signal()

#: activities per page unless asked otherwise
PAGE_SIZE = 50
#: most activities one page may hold
MAX_PAGE_SIZE = 200
#: most distinct names looked up for mentions in one post
MAX_MENTION_NAMES = 100


# --- who may see what ------------------------------------------------------------------------


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
    return domain.permits(choices.activity_visibility, relation)


async def acan_see(viewer: Any, activity: Activity) -> bool:
    return await sync_to_async(can_see)(viewer, activity)


# --- posting ---------------------------------------------------------------------------------


def _author_pk(author: Any) -> Any:
    pk = _viewer_pk_of(author)
    if pk is None:
        raise TypeError(f"Expected a saved, authenticated user or a user id, got {author!r}.")
    return pk


def handle_field() -> str:
    """The user model's field of public handles (``HANDLE_FIELD``, else USERNAME_FIELD)."""
    return get_settings().HANDLE_FIELD or get_user_model().USERNAME_FIELD


def handle_of(user: Any) -> str | None:
    """``user``'s public handle, or None where it must not be shown: empty, or an e-mail
    address (a site logging in by e-mail names a public field with HANDLE_FIELD)."""
    value = getattr(user, handle_field(), None)
    if not value or "@" in str(value):
        return None
    return str(value)


def _known_users(names: Sequence[str]) -> dict[str, Any]:
    """Users named (exactly, or ignoring case) by ``names``: handle -> user. One query for
    the exact names (the unique index); a second one only for names typed in another case."""
    if not names:
        return {}
    field = handle_field()
    manager = get_user_model()._default_manager
    known: dict[str, Any] = {}

    def add(users: Any) -> None:
        for user in users:
            handle = handle_of(user)
            if handle is not None:
                known.setdefault(handle, user)

    add(manager.filter(**{f"{field}__in": names}))
    others = [name for name in names if name not in known]
    if others:
        folded = Q()
        for name in others:
            folded |= Q(**{f"{field}__iexact": name})
        add(manager.filter(folded))
    return known


def mentioned_users(text: str) -> list[Any]:
    """The users ``text`` mentions, in text order, each once (see docs/feed.md)."""
    names = feed_domain.candidate_names(text)[:MAX_MENTION_NAMES]
    lookup = feed_domain.case_insensitive_lookup(_known_users(names))
    spans = feed_domain.resolve_mentions(text, lookup)
    return feed_domain.unique_targets(spans, key=lambda user: user.pk)


def _not_blocked(author_pk: int, users: list[Any]) -> list[Any]:
    """``users`` without those blocked by, or blocking, the author: a mention across a block is
    not stored at all (it would reach the blocked user's mentions again after an unblock)."""
    ids = [user.pk for user in users]
    if not ids:
        return users
    pairs = Block.objects.filter(
        Q(blocker=author_pk, blocked__in=ids) | Q(blocker__in=ids, blocked=author_pk)
    ).values_list("blocker", "blocked")
    blocked = {other for pair in pairs for other in pair if other != author_pk}
    return [user for user in users if user.pk not in blocked]


def post(author: Any, text: Any, *, kind: str = ActivityKind.POST) -> Activity:
    """Post ``text`` as ``author`` and record its ``@mentions``, all in one transaction.

    Users blocked by the author, or blocking the author, are not recorded as mentioned (their
    name stays plain text).

    Raises :class:`InvalidInput` (``invalid_message``: not a string; ``invalid_value``: empty,
    longer than ``ACTIVITY_MAX_LENGTH``, control characters); nothing is saved then. Sends
    :data:`activity_posted` after commit.
    """
    author_pk = _author_pk(author)
    text = feed_domain.clean_text(text, get_settings().ACTIVITY_MAX_LENGTH)
    alias = router.db_for_write(Activity)
    with transaction.atomic(using=alias):
        users = _not_blocked(author_pk, mentioned_users(text))
        activity = Activity(author_id=author_pk, text=text, kind=ActivityKind(kind))
        if not isinstance(author, int | str | UUID):
            activity.author = author
        activity.save(using=alias)
        mentions = [
            Mention(activity=activity, user=user, created_at=activity.created_at) for user in users
        ]
        Mention.objects.using(alias).bulk_create(mentions)
        # What rendering needs, so listeners and callers do not query again.
        setattr(activity, _MENTIONS_ATTR, mentions)
        transaction.on_commit(
            lambda: activity_posted.send(sender=Activity, activity=activity), using=alias
        )
    return activity


# --- groups ----------------------------------------------------------------------------------


def join(user: Any, group: Group) -> bool:
    """Make ``user`` a member of ``group``; False if they already were."""
    try:
        with transaction.atomic(using=router.db_for_write(Membership)):
            _, created = Membership.objects.get_or_create(group=group, user_id=_author_pk(user))
    except IntegrityError:  # joined at the same moment elsewhere
        return False
    return created


def leave(user: Any, group: Group) -> bool:
    """End ``user``'s membership of ``group``; False if they were no member."""
    deleted, _ = Membership.objects.filter(group=group, user_id=_author_pk(user)).delete()
    return deleted > 0


def is_member(user: Any, group: Group) -> bool:
    user_pk = _viewer_pk_of(user)
    return user_pk is not None and Membership.objects.filter(group=group, user=user_pk).exists()


# --- timelines -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """One page of a timeline, newest first. ``next_cursor`` fetches the older activities that
    follow; None when there are none."""

    activities: list[Activity]
    next_cursor: str | None

    def __iter__(self) -> Any:
        return iter(self.activities)

    def __len__(self) -> int:
        return len(self.activities)


def _limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit must be an int from 1 to {MAX_PAGE_SIZE}, got {limit!r}.")
    return limit


def _below(position: Position | None, created: str = "created_at", ident: str = "id") -> Q:
    """Rows strictly older than ``position`` in (created_at, id) order, written so that the
    first condition is an index range and the second a filter on that range."""
    if position is None:
        return Q()
    return Q(**{f"{created}__lte": position.created_at}) & (
        Q(**{f"{created}__lt": position.created_at}) | Q(**{f"{ident}__lt": position.id})
    )


_NEWEST_FIRST = ("-created_at", "-id")


#: where a page keeps each activity's mentions (with their users), read by mentions_of()
_MENTIONS_ATTR = "_presence_mentions"


def _load_mentions(activities: list[Activity]) -> None:
    """Every mention (with its user) of ``activities`` in one query, kept on each activity
    (a plain list: cheaper than prefetch_related's queryset per activity)."""
    found: dict[int, list[Mention]] = {activity.pk: [] for activity in activities}
    for mention in Mention.objects.filter(activity__in=list(found)).select_related("user"):
        found[mention.activity_id].append(mention)
    for activity in activities:
        setattr(activity, _MENTIONS_ATTR, found[activity.pk])


def mentions_of(activity: Activity) -> list[Mention]:
    """The activity's mentions with their users: loaded with the page (no query), or read."""
    loaded = getattr(activity, _MENTIONS_ATTR, None)
    if loaded is None:
        loaded = list(activity.mentions.select_related("user"))
        setattr(activity, _MENTIONS_ATTR, loaded)
    return list(loaded)


def _newest_below(position: Position | None, author: Any, offset: int) -> Subquery:
    """The created_at of an author's ``offset + 1``-th newest activity below ``position``."""
    query = (
        Activity.objects.filter(author=author)
        .filter(_below(position))
        .order_by(*_NEWEST_FIRST)
        .values("created_at")[offset : offset + 1]
    )
    return Subquery(query)


@dataclass(frozen=True)
class _Bound:
    """Where the next page of a many-author timeline can be (see :func:`_lower_bound`)."""

    #: every activity of the page is at or after this time (None: no bound needed)
    since: datetime | None
    #: the authors who can have activities on the page: their ids (or a subquery of them)
    authors: list[int] | QuerySet[Any]


#: most author ids a page query names one by one; past it (ties), a subquery names them
_MAX_LISTED = 1000


def _lower_bound(
    authors: QuerySet[Any], field: str, position: Position | None, need: int
) -> _Bound:
    """Which authors, and since when, the next ``need`` activities of ``authors`` below
    ``position`` can come from; from one index seek per author instead of reading their
    activities (docs/feed.md, "Query plans").

    Each author's newest activity below the position is one seek. If ``need`` authors have
    one, the ``need``-th newest of those bounds the page (``need`` activities lie at or after
    it), and only the authors with an activity since then can be on it. Else only those few
    authors matter; with their k-th newest activities (k = ⌈need / authors⌉) the same argument
    gives a bound, k growing until one holds.
    """
    with_newest = authors.annotate(newest=_newest_below(position, OuterRef(field), 0))
    rows = [
        (pk, when)
        for pk, when in with_newest.order_by(F("newest").desc(nulls_last=True)).values_list(
            field, "newest"
        )[: need + 1]
        if when is not None
    ]
    if len(rows) >= need:
        since = rows[need - 1][1]
        if len(rows) == need or rows[need][1] < since:
            return _Bound(since, [pk for pk, _ in rows[:need]])
        # Ties at the bound: every author whose newest activity is that old may count.
        tied = with_newest.filter(newest__gte=since).values_list(field, flat=True)
        ids = list(tied[: _MAX_LISTED + 1])
        return _Bound(since, ids if len(ids) <= _MAX_LISTED else authors.values(field))
    ids = [pk for pk, _ in rows]
    active = ids
    user_model = get_user_model()
    while active:
        k = math.ceil(need / len(active))
        kth = [
            (pk, when)
            for pk, when in user_model._default_manager.filter(pk__in=active)
            .annotate(kth=_newest_below(position, OuterRef("pk"), k - 1))
            .values_list("pk", "kth")
            if when is not None
        ]
        enough = math.ceil(need / k)  # this many authors with k activities each make `need`
        if len(kth) >= enough:
            return _Bound(sorted((when for _, when in kth), reverse=True)[enough - 1], ids)
        active = [pk for pk, _ in kth]
    # Every author has fewer than k activities below the position: at most len(ids) * k
    # rows in all (or no author at all), read without a bound.
    return _Bound(None, ids)


@dataclass(frozen=True)
class _Rows:
    #: up to limit + 1 activities, newest first
    activities: list[Activity]
    #: more may follow even when there are no more than ``limit`` (see _authors_rows)
    more: bool = False


def _authors_rows(
    authors: QuerySet[Any], field: str, position: Position | None, need: int
) -> _Rows:
    """Up to ``need`` activities below ``position`` of ``authors`` (rows naming a visible
    author in ``field``), newest first."""
    bound = _lower_bound(authors, field, position, need)
    if isinstance(bound.authors, list) and not bound.authors:
        return _Rows([])
    rows = Activity.objects.filter(author__in=bound.authors).filter(_below(position))
    if bound.since is not None:
        rows = rows.filter(created_at__gte=bound.since)
    found = list(rows.select_related("author").order_by(*_NEWEST_FIRST)[:need])
    # Short under a bound only if activities were deleted since the bound was taken: end the
    # page here and let the next one look further.
    short = bound.since is not None and 0 < len(found) < need
    return _Rows(found, more=short)


def _user_rows(author_pk: int, viewer: Any, position: Position | None, need: int) -> _Rows:
    user_model = get_user_model()
    # Uncorrelated: the database decides visibility once, then reads the author's index range.
    allowed = Exists(
        user_model._default_manager.filter(pk=author_pk).filter(visible_to(viewer, "pk"))
    )
    rows = (
        Activity.objects.filter(allowed, author=author_pk)
        .filter(_below(position))
        .select_related("author")
        .order_by(*_NEWEST_FIRST)[:need]
    )
    return _Rows(list(rows))


def _page(rows: _Rows, limit: int) -> Page:
    activities = rows.activities[:limit]
    more = len(rows.activities) > limit or rows.more
    if activities:
        _load_mentions(activities)
    cursor = feed_domain.encode_cursor(_position(activities[-1])) if more and activities else None
    return Page(activities, cursor)


def _position(activity: Activity) -> Position:
    return Position(activity.created_at, activity.pk)


def user_timeline(
    author: Any, viewer: Any, *, cursor: str | None = None, limit: int = PAGE_SIZE
) -> Page:
    """The activities of ``author``, if ``viewer`` may see them (all or none: the rule depends
    on the author only)."""
    limit = _limit(limit)
    position = feed_domain.decode_cursor(cursor)
    return _page(_user_rows(_author_pk(author), viewer, position, limit + 1), limit)


def following_timeline(
    viewer: Any,
    *,
    cursor: str | None = None,
    limit: int = PAGE_SIZE,
    include_self: bool = False,
) -> Page:
    """Activities of everyone ``viewer`` follows (``Contact(owner=viewer)``) that ``viewer``
    may see; with ``include_self``, the viewer's own too. Empty for anonymous viewers."""
    limit = _limit(limit)
    position = feed_domain.decode_cursor(cursor)
    viewer_pk = _viewer_pk_of(viewer)
    if viewer_pk is None:
        return Page([], None)
    followed = Contact.objects.filter(owner=viewer_pk).filter(visible_to(viewer_pk, "contact"))
    rows = _authors_rows(followed, "contact", position, limit + 1)
    if include_self:
        own = _user_rows(viewer_pk, viewer_pk, position, limit + 1)
        merged = sorted([*rows.activities, *own.activities], key=_position, reverse=True)
        rows = _Rows(merged[: limit + 1], more=rows.more)
    return _page(rows, limit)


def group_timeline(
    group: Group, viewer: Any, *, cursor: str | None = None, limit: int = PAGE_SIZE
) -> Page:
    """Activities of the current members of ``group`` that ``viewer`` may see."""
    limit = _limit(limit)
    position = feed_domain.decode_cursor(cursor)
    members = Membership.objects.filter(group=group).filter(visible_to(viewer, "user"))
    return _page(_authors_rows(members, "user", position, limit + 1), limit)


def mentions_timeline(viewer: Any, *, cursor: str | None = None, limit: int = PAGE_SIZE) -> Page:
    """Activities mentioning ``viewer`` that ``viewer`` may see. Empty for anonymous viewers."""
    limit = _limit(limit)
    position = feed_domain.decode_cursor(cursor)
    viewer_pk = _viewer_pk_of(viewer)
    if viewer_pk is None:
        return Page([], None)
    mentions = (
        Mention.objects.filter(user=viewer_pk)
        .filter(_below(position, "created_at", "activity_id"))
        .filter(visible_to(viewer_pk, "activity__author"))
        .select_related("activity__author")
        .order_by("-created_at", "-activity_id")[: limit + 1]
    )
    return _page(_Rows([mention.activity for mention in mentions]), limit)


# --- rendering -------------------------------------------------------------------------------


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


def render_text(activity: Activity, url_name: str | None = None) -> SafeString:
    """The activity's text as HTML: escaped, each stored mention linked to its user's profile
    (``<a class="mention" href="...">@name</a>``, or a ``<span class="mention">`` when there
    is no URL). Names that were unknown when posted stay plain text."""
    text = activity.text
    users = {
        handle: mention.user
        for mention in mentions_of(activity)
        if (handle := handle_of(mention.user)) is not None
    }
    spans = feed_domain.resolve_mentions(text, feed_domain.case_insensitive_lookup(users))
    parts: list[str] = []
    start = 0
    for span in spans:
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


# --- recording status changes as activities (RECORD_STATUS_ACTIVITIES) --------------------------

_OLD_TEXT = "_presence_feed_old_text"


def _status_before_save(
    sender: Any, instance: UserStatus, raw: bool = False, **kwargs: Any
) -> None:
    if raw or not get_settings().RECORD_STATUS_ACTIVITIES:
        return
    old = (
        UserStatus.objects.filter(pk=instance.pk).values_list("text", flat=True).first()
        if instance.pk is not None
        else None
    )
    setattr(instance, _OLD_TEXT, old or "")


def _status_saved(sender: Any, instance: UserStatus, raw: bool = False, **kwargs: Any) -> None:
    if raw or not hasattr(instance, _OLD_TEXT):
        return
    old, new = getattr(instance, _OLD_TEXT), instance.text
    delattr(instance, _OLD_TEXT)
    if not new or new == old:
        return
    user_id = instance.user_id

    def record() -> None:
        try:
            post(user_id, new, kind=ActivityKind.STATUS)
        except Exception:  # a status change must never fail because of the feed
            logger.exception("Presence: could not record the status of user %s", user_id)

    transaction.on_commit(record, using=router.db_for_write(Activity))


def connect_signals() -> None:
    """Record custom status text changes as activities when ``RECORD_STATUS_ACTIVITIES`` is on
    (connected from ``AppConfig.ready``; the setting is read at each save)."""
    pre_save.connect(
        _status_before_save, sender=UserStatus, dispatch_uid="presence_feed_status_pre"
    )
    post_save.connect(_status_saved, sender=UserStatus, dispatch_uid="presence_feed_status_post")


# --- live timelines (the WebSocket's watch_feed) ---------------------------------------------


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
        if not domain.permits(choices.activity_visibility, pairs.relation(viewer, author)):
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
