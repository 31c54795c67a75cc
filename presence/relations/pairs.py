"""The live fan-out's input: the choices of many targets and their relations to many viewers."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections
from django.db.models import BooleanField, Model, Q
from django.db.models.expressions import RawSQL

from presence import domain
from presence.domain import UserId
from presence.models import Block, Contact
from presence.relations.facts import choices_of, facts_query


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


#: past this many ids named in one query, the fan-out reads the targets' whole contact lists
#: instead (SQLite takes at most 32,766 parameters in a statement; see _pairs_queries)
IDS_IN_QUERY = 30_000


#: Django's integer fields, whose ids the database takes as Python ints
_INTEGER_FIELDS = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "SmallAutoField",
        "IntegerField",
        "BigIntegerField",
        "SmallIntegerField",
        "PositiveIntegerField",
        "PositiveBigIntegerField",
        "PositiveSmallIntegerField",
    }
)


def _named(model: type[Model], field_name: str, ids: Collection[Any]) -> Any:
    """``field IN (ids)``, a condition to filter ``model`` by. Integer ids are handed to the
    database as they are: Django's ``__in`` prepares each id, twice, through the field (a few
    microseconds each), which for a thousand viewers took longer than the query. Other ids
    (UUIDs, strings) are prepared by the field, once each."""
    field: Any = model._meta.get_field(field_name)  # a concrete field: it has a column
    connection = connections[model._default_manager.db]
    values = list(ids)
    integers = field.target_field.get_internal_type() in _INTEGER_FIELDS
    if not (integers and all(type(value) is int for value in values)):
        values = [field.get_db_prep_value(value, connection) for value in values]
    quote = connection.ops.quote_name
    column = f"{quote(model._meta.db_table)}.{quote(field.column)}"
    placeholders = ", ".join(["%s"] * len(values))
    return RawSQL(f"{column} IN ({placeholders})", values, output_field=BooleanField())


def _pairs_queries(viewer_pks: Collection[Any], target_ids: Collection[Any]) -> tuple[Any, ...]:
    # The targets' contact rows naming one of the viewers: at most one row per pair that is a
    # contact. Reading the targets' whole contact lists instead (thousands of rows for a
    # delivery of many targets, each converted by Django) took most of a busy process's time
    # in the load test; it is kept for a number of ids no statement takes.
    contacts = Contact.objects.filter(owner__in=target_ids)
    if viewer_pks and len(viewer_pks) + len(target_ids) <= IDS_IN_QUERY:
        contacts = contacts.filter(_named(Contact, "contact", viewer_pks))
    elif not viewer_pks:
        contacts = contacts.none()
    return (
        facts_query(None, target_ids),
        contacts.values_list("owner_id", "contact_id", "close_friend"),
        Block.objects.filter(Q(blocker__in=target_ids) | Q(blocked__in=target_ids)).values_list(
            "blocker_id", "blocked_id"
        ),
    )


async def aload_pairs(viewer_pks: Collection[UserId], target_ids: Collection[UserId]) -> PairFacts:
    """Choices of every existing target and its relation to every viewer: three queries
    whatever the number of viewers (unknown targets are left out), in one trip to the
    database's thread (each trip waits for that thread, then for the event loop: under load,
    the most of a live delivery's time)."""
    if not target_ids:
        return PairFacts({}, {}, set())
    return await sync_to_async(load_pairs)(viewer_pks, target_ids)


def load_pairs(viewer_pks: Collection[UserId], target_ids: Collection[UserId]) -> PairFacts:
    if not target_ids:
        return PairFacts({}, {}, set())
    rows_query, contacts_query, blocks_query = _pairs_queries(viewer_pks, target_ids)
    return PairFacts(
        {row[0]: choices_of(row) for row in rows_query},
        {(owner, contact): close for owner, contact, close in contacts_query},
        {frozenset(pair) for pair in blocks_query},
    )
