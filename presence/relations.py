"""Who may see whom: privacy choices and relations of many targets to one viewer, in one query."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, Q

from presence import domain
from presence.domain import UserId
from presence.models import Block, Contact
from presence.users import viewer_pk as viewer_id

Facts = dict[UserId, tuple[domain.Relation, domain.Choices]]

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


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _choices(row: dict[str, Any]) -> domain.Choices:
    defaults = domain.Choices()
    return domain.Choices(
        online_visibility=domain.Visibility(
            row["presence_privacy__online_visibility"] or defaults.online_visibility
        ),
        last_seen_visibility=domain.Visibility(
            row["presence_privacy__last_seen_visibility"] or defaults.last_seen_visibility
        ),
        activity_visibility=domain.Visibility(
            row["presence_privacy__activity_visibility"] or defaults.activity_visibility
        ),
        invisible=bool(row["presence_privacy__invisible"]),
        dnd=bool(row["presence_status__dnd"]),
        text=row["presence_status__text"] or None,
        emoji=row["presence_status__emoji"] or None,
        activity=row["presence_status__activity"] or None,
        expires_at=_epoch(row["presence_status__expires_at"]),
        persisted_last_seen=_epoch(row["presence_last_seen__seen_at"]),
    )


def facts_query(viewer_pk: Any, target_ids: Collection[Any]) -> Any:
    # Any: the lookups' types are the site's pk's (see presence.users.user_pk).
    queryset = get_user_model()._default_manager.filter(pk__in=target_ids)
    if viewer_pk is not None:
        target = OuterRef("pk")
        queryset = queryset.annotate(
            viewer_is_contact=Exists(Contact.objects.filter(owner=target, contact=viewer_pk)),
            viewer_is_close_friend=Exists(
                Contact.objects.filter(owner=target, contact=viewer_pk, close_friend=True)
            ),
            blocked=Exists(
                Block.objects.filter(
                    Q(blocker=target, blocked=viewer_pk) | Q(blocker=viewer_pk, blocked=target)
                )
            ),
        )
        return queryset.values(*_FIELDS, "viewer_is_contact", "viewer_is_close_friend", "blocked")
    return queryset.values(*_FIELDS)


def _relation(viewer_pk: UserId | None, row: dict[str, Any]) -> domain.Relation:
    if viewer_pk is None:
        return domain.STRANGER
    if row["pk"] == viewer_pk:
        return domain.SELF
    return domain.Relation(
        is_contact=row["viewer_is_contact"],
        is_close_friend=row["viewer_is_close_friend"],
        blocked=row["blocked"],
    )


def _facts(viewer_pk: UserId | None, rows: list[dict[str, Any]]) -> Facts:
    return {row["pk"]: (_relation(viewer_pk, row), _choices(row)) for row in rows}


def load(viewer: Any, target_ids: Collection[UserId]) -> Facts:
    """Relation to ``viewer`` and choices of every existing target; unknown ids are left out."""
    if not target_ids:
        return {}
    viewer_pk = viewer_id(viewer)
    return _facts(viewer_pk, list(facts_query(viewer_pk, target_ids)))


async def aload(viewer: Any, target_ids: Collection[UserId]) -> Facts:
    if not target_ids:
        return {}
    viewer_pk = viewer_id(viewer)
    return _facts(viewer_pk, [row async for row in facts_query(viewer_pk, target_ids)])


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
    return PairFacts({row["pk"]: _choices(row) for row in rows}, contacts, blocks)


def load_pairs(viewer_pks: Collection[UserId], target_ids: Collection[UserId]) -> PairFacts:
    if not target_ids:
        return PairFacts({}, {}, set())
    rows_query, contacts_query, blocks_query = _pairs_queries(viewer_pks, target_ids)
    return PairFacts(
        {row["pk"]: _choices(row) for row in rows_query},
        {(owner, contact): close for owner, contact, close in contacts_query},
        {frozenset(pair) for pair in blocks_query},
    )
