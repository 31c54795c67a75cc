"""Privacy facts of many targets for one viewer, in one query: each target's choices (its
PrivacySettings row or the site's DEFAULT_PRIVACY) and its relation to the viewer."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, Q, Subquery

from presence import domain
from presence.domain import UserId
from presence.models import Block, Contact, privacy_defaults
from presence.users import viewer_pk as viewer_id

Facts = dict[UserId, tuple[domain.Relation, domain.Choices]]

#: the target's choices, read in this order (rows are tuples: thousands of them per call)
FIELDS = (
    "pk",
    "presence_privacy__online_visibility",
    "presence_privacy__last_seen_visibility",
    "presence_privacy__activity_visibility",
    "presence_privacy__invisible",
    "presence_status__dnd",
    "presence_status__text",
    "presence_status__emoji",
    "presence_status__activity",
    "presence_status__expires_at",
    "presence_last_seen__seen_at",
)
_VISIBILITIES = {level.value: level for level in domain.Visibility}


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _visibility(value: str | None, default: domain.Visibility) -> domain.Visibility:
    if not value:
        return default
    # A dictionary instead of Visibility(value), which is slow; an unknown value still raises.
    return _VISIBILITIES.get(value) or domain.Visibility(value)


def choices_of(row: Sequence[Any]) -> domain.Choices:
    """The choices of a row of :data:`FIELDS`, by position (no PrivacySettings or
    UserStatus row: the defaults; the levels of no PrivacySettings row: the site's
    DEFAULT_PRIVACY, :func:`presence.models.privacy_defaults`, read with no query)."""
    defaults = privacy_defaults()
    return domain.Choices(
        online_visibility=_visibility(row[1], defaults.online_visibility),
        last_seen_visibility=_visibility(row[2], defaults.last_seen_visibility),
        activity_visibility=_visibility(row[3], defaults.activity_visibility),
        invisible=bool(row[4]),
        dnd=bool(row[5]),
        text=row[6] or None,
        emoji=row[7] or None,
        activity=row[8] or None,
        expires_at=_epoch(row[9]),
        persisted_last_seen=_epoch(row[10]),
    )


def facts_query(viewer_pk: Any, target_ids: Collection[Any], *columns: str) -> Any:
    """Rows of :data:`FIELDS`, then ``columns``, then for a viewer the target's tie to them
    (NULL: the target has no Contact row of the viewer, else that row's close_friend) and
    whether a block stands between them either way (two index lookups per target)."""
    # Any: the lookups' types are the site's pk's (see presence.users.user_pk).
    queryset = get_user_model()._default_manager.filter(pk__in=target_ids)
    if viewer_pk is None:
        return queryset.values_list(*FIELDS, *columns)
    target = OuterRef("pk")
    # Names no user model is likely to have as fields (an annotation may not shadow one).
    # Annotations come last: the order in which the database sends them (see _read_rows).
    return queryset.annotate(
        presence_viewer_tie=Subquery(
            Contact.objects.filter(owner=target, contact=viewer_pk).values("close_friend")[:1]
        ),
        presence_blocked=Exists(
            Block.objects.filter(
                Q(blocker=target, blocked=viewer_pk) | Q(blocker=viewer_pk, blocked=target)
            )
        ),
    ).values_list(*FIELDS, *columns, "presence_viewer_tie", "presence_blocked")


#: the few relations a row can express, built once (they are immutable)
_RELATIONS = {
    (tie, blocked): domain.Relation(
        is_contact=tie is not None, is_close_friend=bool(tie), blocked=blocked
    )
    for tie in (None, False, True)
    for blocked in (False, True)
}


def relation_of(viewer_pk: UserId | None, row: Sequence[Any], pk: UserId) -> domain.Relation:
    if viewer_pk is None:
        return domain.STRANGER
    if pk == viewer_pk:
        return domain.SELF
    # A viewer's row ends with the tie and the block (facts_query).
    tie, blocked = row[-2], row[-1]
    return _RELATIONS[None if tie is None else bool(tie), bool(blocked)]


def _facts(viewer_pk: UserId | None, rows: Iterable[tuple[Any, ...]]) -> Facts:
    return {row[0]: (relation_of(viewer_pk, row, row[0]), choices_of(row)) for row in rows}


def load(viewer: Any, target_ids: Collection[UserId]) -> Facts:
    """Relation to ``viewer`` and choices of every existing target; unknown ids are left out."""
    if not target_ids:
        return {}
    viewer_pk = viewer_id(viewer)
    return _facts(viewer_pk, facts_query(viewer_pk, target_ids))


async def aload(viewer: Any, target_ids: Collection[UserId]) -> Facts:
    if not target_ids:
        return {}
    viewer_pk = viewer_id(viewer)
    return _facts(viewer_pk, [row async for row in facts_query(viewer_pk, target_ids)])
