"""The live fan-out's input: the choices of many targets and their relations to many viewers."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async

from presence import domain
from presence.domain import UserId
from presence.models import Contact, PrivacyException
from presence.relations.facts import (
    choices_of,
    fact_rows,
    hides_own_last_seen,
    reciprocal,
    relation,
)
from presence.relations.ties import Statement, blocks_rows


@dataclass(frozen=True)
class PairFacts:
    """Choices of many targets and their relations to many viewers (the live fan-out's input)."""

    choices: dict[UserId, domain.Choices]
    #: (target, viewer) -> viewer is close friend, for each target that has the viewer as contact
    #: (with reciprocity also (viewer, target): the viewer's own contacts among the targets)
    contacts: dict[tuple[UserId, UserId], bool]
    #: {a, b} pairs with a block in either direction
    blocks: set[frozenset[UserId]]
    #: (owner, viewer) -> the owner's exceptions for the viewer (domain.exception_bits, or-ed)
    exceptions: dict[tuple[UserId, UserId], int] = field(default_factory=dict)
    #: with RECIPROCAL_LAST_SEEN, the viewers' own choices (None: no reciprocity)
    viewer_choices: dict[UserId, domain.Choices] | None = None

    def relation(self, viewer_pk: UserId | None, target_pk: UserId) -> domain.Relation:
        """The same relation :func:`load` computes for one viewer (tests hold them equal)."""
        if viewer_pk is None:
            return domain.STRANGER
        if viewer_pk == target_pk:
            return domain.SELF
        blocked = frozenset((viewer_pk, target_pk)) in self.blocks
        exceptions = self.exceptions.get((target_pk, viewer_pk), 0) if self.exceptions else 0
        hides = False
        if self.viewer_choices is not None and not blocked:
            own = self.viewer_choices.get(viewer_pk, domain.Choices())
            hides = hides_own_last_seen(
                own,
                self.contacts.get((viewer_pk, target_pk)),
                blocked,
                self.exceptions.get((viewer_pk, target_pk), 0),
            )
        return relation(self.contacts.get((target_pk, viewer_pk)), blocked, exceptions, hides)


#: past this many ids named in one query, the fan-out reads the targets' whole contact lists
#: instead (SQLite takes at most 32,766 parameters in a statement; see _pair_ties_rows)
IDS_IN_QUERY = 30_000


def _pair_ties_rows(
    viewer_pks: Collection[Any], target_ids: Collection[Any], with_own: bool
) -> list[tuple[Any, Any, Any, str]]:
    """The targets' contact rows naming one of the viewers and the targets' exceptions for
    them, as one statement (a UNION ALL): ``(owner, other, flag, setting)``, ``setting`` empty
    for a contact row (``flag``: close friend), else an exception's (``flag``: allow). With
    reciprocity, the viewers' own rows naming a target too."""
    if not viewer_pks:
        return []
    # At most one contact row per pair that is a contact. Reading the targets' whole contact
    # lists instead (thousands of rows for a delivery of many targets, each converted) took
    # most of a busy process's time in the load test; it is kept for a number of ids no
    # statement takes.
    parts = 4 if with_own else 2  # each part of the statement names the ids
    named = parts * (len(viewer_pks) + len(target_ids)) <= IDS_IN_QUERY
    contact, exception = Statement(Contact), Statement(PrivacyException)
    params: list[Any] = []
    selects = []

    def part(
        statement: Statement, other: str, flag: str, setting: str | None, owners: Any, others: Any
    ) -> str:
        shown = statement.column("setting") if setting else "''"
        where = statement.named("owner", owners, params)
        if named:
            where += " AND " + statement.named(other, others, params)
        return (
            f"SELECT {statement.column('owner')}, {statement.column(other)}, "
            f"{statement.column(flag)}, {shown} FROM {statement.table} WHERE {where}"
        )

    sides = [(target_ids, viewer_pks)] + ([(viewer_pks, target_ids)] if with_own else [])
    for owners, others in sides:
        selects.append(part(contact, "contact", "close_friend", None, owners, others))
        selects.append(part(exception, "viewer", "allow", "setting", owners, others))
    return contact.rows(" UNION ALL ".join(selects), params, ids=(0, 1))


def _pairs_queries(
    viewer_pks: Collection[Any], target_ids: Collection[Any], with_own: bool
) -> tuple[Any, ...]:
    # With reciprocity the viewers' own choices come in the targets' rows' statement; its SQL
    # compiled once per shape where it can be (a fan-out names hundreds of users: Django
    # preparing each id of the IN was a twentieth of a busy process's time).
    users = [*target_ids, *viewer_pks] if with_own else target_ids
    return (
        fact_rows(None, users),
        _pair_ties_rows(viewer_pks, target_ids, with_own),
        blocks_rows(target_ids),
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
    with_own = reciprocal() and bool(viewer_pks)
    rows_query, ties_query, blocks_query = _pairs_queries(viewer_pks, target_ids, with_own)
    choices = {row[0]: choices_of(row) for row in rows_query}
    viewer_choices = None
    if with_own:
        viewer_choices = {pk: choices[pk] for pk in viewer_pks if pk in choices}
        targets = set(target_ids)
        choices = {pk: value for pk, value in choices.items() if pk in targets}
    contacts: dict[tuple[UserId, UserId], bool] = {}
    exceptions: dict[tuple[UserId, UserId], int] = {}
    for owner, other, flag, setting in ties_query:
        if setting:
            pair = (owner, other)
            exceptions[pair] = exceptions.get(pair, 0) | domain.exception_bits(setting, bool(flag))
        else:
            contacts[owner, other] = bool(flag)
    return PairFacts(
        choices,
        contacts,
        {frozenset(pair) for pair in blocks_query},
        exceptions,
        viewer_choices,
    )
