"""Privacy facts of many targets for one viewer, in one query: each target's choices (its
PrivacySettings row or the site's DEFAULT_PRIVACY) and its relation to the viewer."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import router
from django.db.models import Case, Exists, IntegerField, OuterRef, Q, Subquery, Sum, Value, When

from presence import domain
from presence.conf import get_settings
from presence.domain import UserId
from presence.models import Block, Contact, PrivacyException, PrivacySettings, privacy_defaults
from presence.relations import compiled
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
    "presence_last_seen__prior_seen_at",
)
_VISIBILITIES = {level.value: level for level in domain.Visibility}


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _visibility(value: str | None, default: domain.Visibility) -> domain.Visibility:
    if not value:
        return default
    # A dictionary instead of Visibility(value), which is slow; an unknown value still raises.
    return _VISIBILITIES.get(value) or domain.Visibility(value)


def choices_of(row: Sequence[Any], defaults: domain.Choices | None = None) -> domain.Choices:
    """The choices of a row of :data:`FIELDS`, by position (no PrivacySettings or
    UserStatus row: the defaults; the levels of no PrivacySettings row: the site's
    DEFAULT_PRIVACY, :func:`presence.models.privacy_defaults`, read with no query, or
    ``defaults`` where the caller read them once for many rows)."""
    if defaults is None:
        defaults = privacy_defaults()
    if not any(row[1:12]):
        # No row of its choices, or rows of nothing but defaults (a room's 100 members of
        # whom most have none): the defaults' one object.
        return _no_choices(defaults)
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
        persisted_prior=_epoch(row[11]),
    )


#: (the defaults, the choices of a row of no choices) as last made (_no_choices)
_no_choices_made: tuple[domain.Choices, domain.Choices] | None = None


def _no_choices(defaults: domain.Choices) -> domain.Choices:
    """The choices of a row of :data:`FIELDS` whose every choice is empty (None, False or
    ""): what :func:`choices_of` makes of it, once per DEFAULT_PRIVACY (found by identity: a
    cache keyed by the defaults hashed their eleven fields for every row)."""
    global _no_choices_made
    made = _no_choices_made
    if made is None or made[0] is not defaults:
        made = _no_choices_made = (
            defaults,
            domain.Choices(
                online_visibility=defaults.online_visibility,
                last_seen_visibility=defaults.last_seen_visibility,
                activity_visibility=defaults.activity_visibility,
            ),
        )
    return made[1]


#: each exception row's bit (domain.exception_bits), as SQL: summed per pair (one row per
#: owner, viewer and setting, so the sum is the bits or-ed)
_EXCEPTION_BIT = Case(
    *(
        When(setting=setting, allow=allow, then=Value(domain.exception_bits(setting, allow)))
        for setting in domain.VISIBILITY_SETTINGS
        for allow in (True, False)
    ),
    default=Value(0),
    output_field=IntegerField(),
)


def exceptions_of(owner: Any, viewer: Any) -> Subquery:
    """The bits of ``owner``'s exceptions for ``viewer`` (NULL: none), one index lookup."""
    return Subquery(
        PrivacyException.objects.filter(owner=owner, viewer=viewer)
        .order_by()
        .values("owner")
        .annotate(bits=Sum(_EXCEPTION_BIT))
        .values("bits")[:1],
        output_field=IntegerField(),
    )


def reciprocal() -> bool:
    """Whether relations carry RECIPROCAL_LAST_SEEN's facts (the viewer's own side)."""
    return get_settings().RECIPROCAL_LAST_SEEN is True


#: a viewer's row ends with these (facts_query): the target's tie to the viewer, a block
#: either way and the target's exceptions for the viewer; with RECIPROCAL_LAST_SEEN the
#: viewer's own side comes before them (their exceptions for the target, their tie to it,
#: their levels and invisible)
_TAIL = ("presence_viewer_tie", "presence_blocked", "presence_exceptions")


def facts_query(viewer_pk: Any, target_ids: Collection[Any], *columns: str) -> Any:
    """Rows of :data:`FIELDS`, then ``columns``, then for a viewer the target's tie to them
    (NULL: the target has no Contact row of the viewer, else that row's close_friend), whether
    a block stands between them either way and the target's exceptions for the viewer (index
    lookups per target); with RECIPROCAL_LAST_SEEN, the viewer's own side before those."""
    # Any: the lookups' types are the site's pk's (see presence.users.user_pk).
    queryset = get_user_model()._default_manager.filter(pk__in=target_ids)
    if viewer_pk is None:
        return queryset.values_list(*FIELDS, *columns)
    target = OuterRef("pk")
    own: dict[str, Any] = {}
    if reciprocal():
        # The viewer's levels are one row read once (the subqueries name no target).
        mine = PrivacySettings.objects.filter(user=viewer_pk)
        own = {
            "presence_own_exceptions": exceptions_of(viewer_pk, target),
            "presence_own_tie": Subquery(
                Contact.objects.filter(owner=viewer_pk, contact=target).values("close_friend")[:1]
            ),
            "presence_own_online": Subquery(mine.values("online_visibility")[:1]),
            "presence_own_last_seen": Subquery(mine.values("last_seen_visibility")[:1]),
            "presence_own_invisible": Subquery(mine.values("invisible")[:1]),
        }
    # Names no user model is likely to have as fields (an annotation may not shadow one).
    # Annotations come last: the order in which the database sends them (see _read_rows).
    return queryset.annotate(
        **own,
        presence_viewer_tie=Subquery(
            Contact.objects.filter(owner=target, contact=viewer_pk).values("close_friend")[:1]
        ),
        presence_blocked=Exists(
            Block.objects.filter(
                Q(blocker=target, blocked=viewer_pk) | Q(blocker=viewer_pk, blocked=target)
            )
        ),
        presence_exceptions=exceptions_of(target, viewer_pk),
    ).values_list(*FIELDS, *columns, *own, *_TAIL)


def _tie(value: Any) -> bool | None:
    return None if value is None else bool(value)


@cache
def relation(
    tie: bool | None, blocked: bool, exceptions: int, hides_own_last_seen: bool = False
) -> domain.Relation:
    """The relation of these facts, built once (relations are immutable; few distinct ones)."""
    return domain.Relation(
        is_contact=tie is not None,
        is_close_friend=bool(tie),
        blocked=blocked,
        exceptions=exceptions,
        hides_own_last_seen=hides_own_last_seen,
    )


def hides_own_last_seen(
    own: domain.Choices, own_tie: bool | None, blocked: bool, own_exceptions: int
) -> bool:
    """RECIPROCAL_LAST_SEEN: whether the viewer hides their exact last seen from the target,
    by the viewer's choices and the viewer's relation to the target (the one rule,
    domain.shows_last_seen, the other way round)."""
    return not domain.shows_last_seen(own, relation(own_tie, blocked, own_exceptions))


@cache
def _own_choices(
    online: str | None, last_seen: str | None, invisible: bool, defaults: domain.Choices
) -> domain.Choices:
    return domain.Choices(
        online_visibility=_visibility(online, defaults.online_visibility),
        last_seen_visibility=_visibility(last_seen, defaults.last_seen_visibility),
        invisible=invisible,
    )


def relation_of(
    viewer_pk: UserId | None, row: Sequence[Any], pk: UserId, with_own: bool = False
) -> domain.Relation:
    """The relation of a row of :func:`facts_query` (``with_own``: read with reciprocity)."""
    if viewer_pk is None:
        return domain.STRANGER
    if pk == viewer_pk:
        return domain.SELF
    # A viewer's row ends with the tie, the block and the exceptions (facts_query).
    tie, blocked, exceptions = _tie(row[-3]), bool(row[-2]), row[-1] or 0
    hides = False
    if with_own and not blocked:
        own_exceptions, own_tie, online, last_seen, invisible = row[-8:-3]
        own = _own_choices(online, last_seen, bool(invisible), privacy_defaults())
        hides = hides_own_last_seen(own, _tie(own_tie), blocked, own_exceptions or 0)
    return relation(tie, blocked, exceptions, hides)


def _facts(viewer_pk: UserId | None, rows: Iterable[Sequence[Any]], with_own: bool) -> Facts:
    defaults = privacy_defaults()  # once, not per row: a room's read has a hundred
    return {
        row[0]: (relation_of(viewer_pk, row, row[0], with_own), choices_of(row, defaults))
        for row in rows
    }


def fact_rows(viewer_pk: UserId | None, target_ids: Collection[UserId]) -> list[Sequence[Any]]:
    """The rows of :func:`facts_query`, from its SQL compiled once per shape where it can be
    (presence.relations.compiled). Blocking: the database's thread."""
    size = compiled.padded_size(len(target_ids))
    if size is not None:
        alias = router.db_for_read(get_user_model())
        shape = compiled.compile_facts(
            alias, viewer_pk is not None, reciprocal(), size, facts_query
        )
        if shape is not None:
            return compiled.run_compiled(shape, alias, viewer_pk, target_ids)
    return list(facts_query(viewer_pk, target_ids))


def load(viewer: Any, target_ids: Collection[UserId]) -> Facts:
    """Relation to ``viewer`` and choices of every existing target; unknown ids are left out."""
    if not target_ids:
        return {}
    viewer_pk = viewer_id(viewer)
    return _facts(viewer_pk, fact_rows(viewer_pk, target_ids), reciprocal())


async def aload(viewer: Any, target_ids: Collection[UserId]) -> Facts:
    """:func:`load` in one hop to the database's thread."""
    return await sync_to_async(load)(viewer, target_ids) if target_ids else {}
