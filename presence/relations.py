"""Who may see whom: privacy choices and relations of many targets to one viewer, in one query."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, Q, Subquery

from presence import domain
from presence.domain import UserId
from presence.models import Block, Contact
from presence.users import viewer_pk as viewer_id

Facts = dict[UserId, tuple[domain.Relation, domain.Choices]]

#: the target's choices, read in this order (rows are tuples: thousands of them per call)
_FIELDS = (
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
_DEFAULTS = domain.Choices()
_VISIBILITIES = {level.value: level for level in domain.Visibility}


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _visibility(value: str | None, default: domain.Visibility) -> domain.Visibility:
    if not value:
        return default
    # A dictionary instead of Visibility(value), which is slow; an unknown value still raises.
    return _VISIBILITIES.get(value) or domain.Visibility(value)


def _choices(row: tuple[Any, ...]) -> domain.Choices:
    """The choices of a row of :data:`_FIELDS`, by position (no PrivacySettings or
    UserStatus row: the defaults)."""
    return domain.Choices(
        online_visibility=_visibility(row[1], _DEFAULTS.online_visibility),
        last_seen_visibility=_visibility(row[2], _DEFAULTS.last_seen_visibility),
        activity_visibility=_visibility(row[3], _DEFAULTS.activity_visibility),
        invisible=bool(row[4]),
        dnd=bool(row[5]),
        text=row[6] or None,
        emoji=row[7] or None,
        activity=row[8] or None,
        expires_at=_epoch(row[9]),
        persisted_last_seen=_epoch(row[10]),
    )


def facts_query(viewer_pk: Any, target_ids: Collection[Any], *columns: str) -> Any:
    """Rows of :data:`_FIELDS`, then for a viewer the target's tie to them (NULL: the target
    has no Contact row of the viewer, else that row's close_friend) and whether a block
    stands between them either way (two index lookups per target), then ``columns``."""
    # Any: the lookups' types are the site's pk's (see presence.users.user_pk).
    queryset = get_user_model()._default_manager.filter(pk__in=target_ids)
    if viewer_pk is None:
        return queryset.values_list(*_FIELDS, *columns)
    target = OuterRef("pk")
    # Names no user model is likely to have as fields (an annotation may not shadow one).
    return queryset.annotate(
        presence_viewer_tie=Subquery(
            Contact.objects.filter(owner=target, contact=viewer_pk).values("close_friend")[:1]
        ),
        presence_blocked=Exists(
            Block.objects.filter(
                Q(blocker=target, blocked=viewer_pk) | Q(blocker=viewer_pk, blocked=target)
            )
        ),
    ).values_list(*_FIELDS, "presence_viewer_tie", "presence_blocked", *columns)


#: where a viewer's tie to the target sits in a row of facts_query(), the block after it
_TIE = len(_FIELDS)

#: the few relations a row can express, built once (they are immutable)
_RELATIONS = {
    (tie, blocked): domain.Relation(
        is_contact=tie is not None, is_close_friend=bool(tie), blocked=blocked
    )
    for tie in (None, False, True)
    for blocked in (False, True)
}


def _relation(viewer_pk: UserId | None, row: tuple[Any, ...]) -> domain.Relation:
    if viewer_pk is None:
        return domain.STRANGER
    if row[0] == viewer_pk:
        return domain.SELF
    tie, blocked = row[_TIE], row[_TIE + 1]
    return _RELATIONS[None if tie is None else bool(tie), bool(blocked)]


def _facts(viewer_pk: UserId | None, rows: Iterable[tuple[Any, ...]]) -> Facts:
    return {row[0]: (_relation(viewer_pk, row), _choices(row)) for row in rows}


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


#: where a viewer's row of facts_query() ends and the columns asked for begin
_USER_COLUMNS = _TIE + 2


@dataclass(frozen=True)
class FactsAndUsers:
    """The privacy facts of many targets and their rows as users, read in one query; a user
    object is built only when asked for (``online_friends`` builds only those it lists)."""

    facts: Facts
    rows: dict[UserId, tuple[Any, ...]]
    model: Any
    attnames: tuple[str, ...]
    db: str

    def users(self, ids: Iterable[UserId]) -> list[Any]:
        """The users of these ids in this order, as the user model's manager would load
        them (``Model.from_db``); ids not read are left out."""
        build, rows = self.model.from_db, self.rows
        return [build(self.db, self.attnames, rows[pk]) for pk in ids if pk in rows]


def _facts_and_users_query(viewer: Any, target_ids: Collection[UserId]) -> tuple[Any, Any, Any]:
    viewer_pk = viewer_id(viewer)
    model = get_user_model()
    attnames = tuple(field.attname for field in model._meta.concrete_fields)
    return viewer_pk, attnames, facts_query(viewer_pk, target_ids, *attnames)


def _facts_and_users(
    viewer_pk: UserId | None, attnames: tuple[str, ...], rows: list[tuple[Any, ...]], db: str
) -> FactsAndUsers:
    start = _USER_COLUMNS if viewer_pk is not None else len(_FIELDS)
    return FactsAndUsers(
        facts=_facts(viewer_pk, rows),
        rows={row[0]: row[start:] for row in rows},
        model=get_user_model(),
        attnames=attnames,
        db=db,
    )


def load_with_users(viewer: Any, target_ids: Collection[UserId]) -> FactsAndUsers:
    """:func:`load` and the targets' user rows together: one query for both."""
    viewer_pk, attnames, query = _facts_and_users_query(viewer, target_ids)
    rows = list(query) if target_ids else []
    return _facts_and_users(viewer_pk, attnames, rows, query.db)


async def aload_with_users(viewer: Any, target_ids: Collection[UserId]) -> FactsAndUsers:
    viewer_pk, attnames, query = _facts_and_users_query(viewer, target_ids)
    rows = [row async for row in query] if target_ids else []
    return _facts_and_users(viewer_pk, attnames, rows, query.db)


async def aexisting(target_ids: Collection[Any]) -> set[UserId]:
    """Which of these ids are users' (one query)."""
    if not target_ids:
        return set()
    query = get_user_model()._default_manager.filter(pk__in=target_ids).values_list("pk", flat=True)
    return {pk async for pk in query}


def friends_query(user_pk: Any) -> Any:
    """Ids of mutual contacts of a user, in one query."""
    return (
        Contact.objects.filter(owner=user_pk)
        .filter(Exists(Contact.objects.filter(owner=OuterRef("contact"), contact=user_pk)))
        .values_list("contact_id", flat=True)
    )


def friend_ids(user: Any) -> list[UserId]:
    user_pk = viewer_id(user)
    return [] if user_pk is None else list(friends_query(user_pk))


async def afriend_ids(user: Any) -> list[UserId]:
    user_pk = viewer_id(user)
    return [] if user_pk is None else [pk async for pk in friends_query(user_pk)]


@dataclass(frozen=True)
class PairFacts:
    """Choices of many targets and their relations to many viewers (the live fan-out's input)."""

    choices: dict[UserId, domain.Choices]
    #: (target, viewer) -> viewer is close friend, for each target that has the viewer as contact
    contacts: dict[tuple[UserId, UserId], bool]
    #: {a, b} pairs with a block in either direction
    blocks: set[frozenset[UserId]]

    def relation(self, viewer_pk: UserId | None, target_pk: UserId) -> domain.Relation:
        """The same relation :func:`load` computes for one viewer (tests hold them equal)."""
        if viewer_pk is None:
            return domain.STRANGER
        if viewer_pk == target_pk:
            return domain.SELF
        close = self.contacts.get((target_pk, viewer_pk))
        return domain.Relation(
            is_contact=close is not None,
            is_close_friend=bool(close),
            blocked=frozenset((viewer_pk, target_pk)) in self.blocks,
        )


#: past this many viewers, the fan-out reads the targets' whole contact lists rather than
#: naming every viewer in the query (see _pairs_queries)
VIEWERS_IN_QUERY = 50


def _pairs_queries(viewer_pks: Collection[Any], target_ids: Collection[Any]) -> tuple[Any, ...]:
    # Django prepares each id of an IN list (several microseconds each, twice): with a thousand
    # viewers that cost more than reading the targets' own contact lists (bounded by whom they
    # added) and every block involving them (few), which are filtered by PairFacts.relation.
    contacts = Contact.objects.filter(owner__in=target_ids)
    if len(viewer_pks) <= VIEWERS_IN_QUERY:
        contacts = contacts.filter(contact__in=viewer_pks)
    return (
        facts_query(None, target_ids),
        contacts.values_list("owner_id", "contact_id", "close_friend"),
        Block.objects.filter(Q(blocker__in=target_ids) | Q(blocked__in=target_ids)).values_list(
            "blocker_id", "blocked_id"
        ),
    )


async def aload_pairs(viewer_pks: Collection[UserId], target_ids: Collection[UserId]) -> PairFacts:
    """Choices of every existing target and its relation to every viewer: three queries
    whatever the number of viewers (unknown targets are left out)."""
    if not target_ids:
        return PairFacts({}, {}, set())
    rows_query, contacts_query, blocks_query = _pairs_queries(viewer_pks, target_ids)
    rows = [row async for row in rows_query]
    contacts = {(owner, contact): close async for owner, contact, close in contacts_query}
    blocks = {frozenset(pair) async for pair in blocks_query}
    return PairFacts({row[0]: _choices(row) for row in rows}, contacts, blocks)


def load_pairs(viewer_pks: Collection[UserId], target_ids: Collection[UserId]) -> PairFacts:
    if not target_ids:
        return PairFacts({}, {}, set())
    rows_query, contacts_query, blocks_query = _pairs_queries(viewer_pks, target_ids)
    return PairFacts(
        {row[0]: _choices(row) for row in rows_query},
        {(owner, contact): close for owner, contact, close in contacts_query},
        {frozenset(pair) for pair in blocks_query},
    )
