"""The four timelines, computed when they are read from the graph as it is at that moment
(``Contact``, ``Membership``, ``Mention``), newest first and paged by an opaque keyset cursor on
``(created_at, id)``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Exists, F, OuterRef, Q, QuerySet, Subquery

from presence.feed import domain as feed_domain
from presence.feed.api.posting import _author_pk, _load_mentions
from presence.feed.api.visibility import visible_to
from presence.feed.domain import Position
from presence.feed.models import Activity, Group, Membership, Mention
from presence.models import Contact
from presence.users import viewer_pk as _viewer_pk_of

#: activities per page unless asked otherwise
PAGE_SIZE = 50
#: most activities one page may hold
MAX_PAGE_SIZE = 200


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


#: bounds taken for one page before reading it without one (see _authors_rows)
_BOUND_ATTEMPTS = 2


def _authors_rows(
    authors: QuerySet[Any], field: str, position: Position | None, need: int
) -> _Rows:
    """Up to ``need`` activities below ``position`` of ``authors`` (rows naming a visible
    author in ``field``), newest first."""
    for _ in range(_BOUND_ATTEMPTS):
        bound = _lower_bound(authors, field, position, need)
        if isinstance(bound.authors, list) and not bound.authors:
            return _Rows([])
        rows = Activity.objects.filter(author__in=bound.authors).filter(_below(position))
        if bound.since is not None:
            rows = rows.filter(created_at__gte=bound.since)
        found = list(rows.select_related("author").order_by(*_NEWEST_FIRST)[:need])
        if bound.since is None or len(found) == need:
            return _Rows(found)
        # Short under a bound only if activities were deleted since the bound was taken: end
        # the page here and let the next one look further.
        if found:
            return _Rows(found, more=True)
        # Every activity since the bound was deleted: no row to end the page at, so take the
        # bound again (those deletions are seen now).
    # Deleted again and again while read: all the authors' activities below the position,
    # without a bound (as correct, but it may sort many rows).
    rows = Activity.objects.filter(author__in=authors.values(field)).filter(_below(position))
    return _Rows(list(rows.select_related("author").order_by(*_NEWEST_FIRST)[:need]))


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
        own = _user_rows(viewer_pk, viewer_pk, position, limit + 1).activities
        if rows.more:
            # The followed activities end early (some were deleted while read): the page ends
            # at their oldest, or its cursor would pass followed activities not read yet.
            oldest = _position(rows.activities[-1])
            own = [activity for activity in own if _position(activity) > oldest]
        merged = sorted([*rows.activities, *own], key=_position, reverse=True)
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
