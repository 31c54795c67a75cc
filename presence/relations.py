"""Who may see whom: privacy choices and relations of many targets to one viewer, in one query."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import connections
from django.db.models import BooleanField, Exists, Model, OuterRef, Q, Subquery
from django.db.models.base import ModelState
from django.db.models.expressions import RawSQL
from django.db.models.signals import post_init, pre_init
from django.db.models.sql.constants import MULTI

from presence import domain
from presence.domain import UserId
from presence.models import Block, Contact, privacy_defaults
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
_VISIBILITIES = {level.value: level for level in domain.Visibility}


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _visibility(value: str | None, default: domain.Visibility) -> domain.Visibility:
    if not value:
        return default
    # A dictionary instead of Visibility(value), which is slow; an unknown value still raises.
    return _VISIBILITIES.get(value) or domain.Visibility(value)


def _choices(row: Sequence[Any]) -> domain.Choices:
    """The choices of a row of :data:`_FIELDS`, by position (no PrivacySettings or
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
    """Rows of :data:`_FIELDS`, then ``columns``, then for a viewer the target's tie to them
    (NULL: the target has no Contact row of the viewer, else that row's close_friend) and
    whether a block stands between them either way (two index lookups per target)."""
    # Any: the lookups' types are the site's pk's (see presence.users.user_pk).
    queryset = get_user_model()._default_manager.filter(pk__in=target_ids)
    if viewer_pk is None:
        return queryset.values_list(*_FIELDS, *columns)
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
    ).values_list(*_FIELDS, *columns, "presence_viewer_tie", "presence_blocked")


#: the few relations a row can express, built once (they are immutable)
_RELATIONS = {
    (tie, blocked): domain.Relation(
        is_contact=tie is not None, is_close_friend=bool(tie), blocked=blocked
    )
    for tie in (None, False, True)
    for blocked in (False, True)
}


def _relation(viewer_pk: UserId | None, row: Sequence[Any], pk: UserId) -> domain.Relation:
    if viewer_pk is None:
        return domain.STRANGER
    if pk == viewer_pk:
        return domain.SELF
    # A viewer's row ends with the tie and the block (facts_query).
    tie, blocked = row[-2], row[-1]
    return _RELATIONS[None if tie is None else bool(tie), bool(blocked)]


def _facts(viewer_pk: UserId | None, rows: Iterable[tuple[Any, ...]]) -> Facts:
    return {row[0]: (_relation(viewer_pk, row, row[0]), _choices(row)) for row in rows}


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


Converter = Callable[[Any], Any]


@dataclass(frozen=True)
class _RawRows:
    """A values_list query's rows as the database sent them, with Django's converters by
    column: a value is converted only if it is used, when it is used."""

    rows: list[tuple[Any, ...]]
    converters: dict[int, Converter]


def _read_rows(query: Any) -> _RawRows:
    """Run a values_list query as Django would, without converting every value of every row
    at once: thousands of rows a call, each copied twice and every value converted, were most
    of the cost of reading them (and of the garbage collections their copies set off)."""
    compiler = query.query.get_compiler(using=query.db)
    rows = [row for chunk in compiler.execute_sql(MULTI) for row in chunk]
    if compiler.has_extra_select:
        rows = [row[: compiler.col_count] for row in rows]
    # values_list() sends the columns in the order asked for unless annotations come first.
    names = [*query.query.extra_select, *query.query.values_select, *query.query.annotation_select]
    if list(query._fields) != names:  # pragma: no cover - facts_query asks in that order
        raise RuntimeError(f"Presence: columns {names} came in another order than {query._fields}.")
    connection = connections[query.db]
    expressions = [selected[0] for selected in compiler.select[: compiler.col_count]]
    converters: dict[int, Converter] = {}
    for position, (functions, expression) in compiler.get_converters(expressions).items():

        def convert(value: Any, functions: Any = functions, expression: Any = expression) -> Any:
            for function in functions:
                value = function(value, expression, connection)
            return value

        converters[position] = convert
    return _RawRows(rows, converters)


#: columns of _FIELDS whose raw value may not be what Django gives (times are text on
#: SQLite); the booleans are read with bool() (0 and 1 on some databases)
_EXPIRES_AT = _FIELDS.index("presence_status__expires_at")
_SEEN_AT = _FIELDS.index("presence_last_seen__seen_at")


@dataclass(frozen=True)
class FactsAndUsers:
    """The privacy facts of many targets and their rows as users, read in one query; a user
    object is built only when asked for (``online_friends`` builds only those it lists), and
    each target's facts are read from its row as they are iterated (:meth:`each_fact`)."""

    viewer_pk: UserId | None
    #: the raw rows by the targets' pks
    rows: dict[UserId, tuple[Any, ...]]
    converters: dict[int, Converter]
    model: Any
    attnames: tuple[str, ...]
    db: str

    def each_fact(self) -> Iterator[tuple[UserId, tuple[domain.Relation, domain.Choices]]]:
        """Each target's (pk, (relation, choices)), as :func:`load` gives them; resolved one by
        one, thousands of facts need not be kept at once."""
        viewer_pk = self.viewer_pk
        convert = [
            (at, self.converters[at]) for at in (_EXPIRES_AT, _SEEN_AT) if at in self.converters
        ]
        for pk, row in self.rows.items():
            if convert and (row[_EXPIRES_AT] is not None or row[_SEEN_AT] is not None):
                values = list(row[: len(_FIELDS)])
                for at, function in convert:
                    if values[at] is not None:
                        values[at] = function(values[at])
                yield pk, (_relation(viewer_pk, row, pk), _choices(values))
            else:
                yield pk, (_relation(viewer_pk, row, pk), _choices(row))

    @property
    def facts(self) -> Facts:
        return dict(self.each_fact())

    def users(self, ids: Iterable[UserId]) -> list[Any]:
        """The users of these ids in this order, as the user model's manager would load
        them (``Model.from_db``); ids not read are left out."""
        build, rows, db, attnames = _builder(self.model), self.rows, self.db, self.attnames
        start = len(_FIELDS)
        end = start + len(attnames)
        steps = [
            (at - start, convert) for at, convert in self.converters.items() if start <= at < end
        ]
        users = []
        for pk in ids:
            row = rows.get(pk)
            if row is None:
                continue
            values = list(row[start:end])
            for at, convert in steps:
                values[at] = convert(values[at])
            users.append(build(db, attnames, values))
        return users


def _builder(model: Any) -> Callable[[str, tuple[str, ...], list[Any]], Any]:
    """``model.from_db``, or the same without ``Model.__init__``'s work per field where that
    makes the same object: a model that keeps Django's ``from_db`` and ``__init__``, whose
    concrete fields are plain attributes, and that no ``pre_init``/``post_init`` receiver
    listens to (thousands of users a call)."""
    if not _plain_model(model) or pre_init.has_listeners(model) or post_init.has_listeners(model):
        return model.from_db
    new = object.__new__

    def build(db: str, attnames: tuple[str, ...], values: list[Any]) -> Any:
        user = new(model)
        user.__dict__.update(zip(attnames, values, strict=True))
        state = user._state = ModelState()
        state.adding = False
        state.db = db
        return user

    return build


@cache
def _plain_model(model: Any) -> bool:
    """Whether building ``model`` by hand makes what ``Model.from_db`` makes (see _builder)."""
    static = inspect.getattr_static
    if any(static(model, name) is not static(Model, name) for name in ("from_db", "__init__")):
        return False
    # A data descriptor (a field that sets itself up on assignment) must see its value.
    return not any(
        hasattr(inspect.getattr_static(model, field.attname, None), "__set__")
        for field in model._meta.concrete_fields
    )


def _facts_and_users_query(viewer: Any, target_ids: Collection[UserId]) -> tuple[Any, Any, Any]:
    viewer_pk = viewer_id(viewer)
    model = get_user_model()
    attnames = tuple(field.attname for field in model._meta.concrete_fields)
    return viewer_pk, attnames, facts_query(viewer_pk, target_ids, *attnames)


def _facts_and_users(
    viewer_pk: UserId | None, attnames: tuple[str, ...], raw: _RawRows, db: str
) -> FactsAndUsers:
    pk_of = raw.converters.get(0)
    return FactsAndUsers(
        viewer_pk=viewer_pk,
        rows={(row[0] if pk_of is None else pk_of(row[0])): row for row in raw.rows},
        converters=raw.converters,
        model=get_user_model(),
        attnames=attnames,
        db=db,
    )


_NO_ROWS = _RawRows([], {})


def load_with_users(viewer: Any, target_ids: Collection[UserId]) -> FactsAndUsers:
    """:func:`load` and the targets' user rows together: one query for both."""
    viewer_pk, attnames, query = _facts_and_users_query(viewer, target_ids)
    raw = _read_rows(query) if target_ids else _NO_ROWS
    return _facts_and_users(viewer_pk, attnames, raw, query.db)


async def aload_with_users(viewer: Any, target_ids: Collection[UserId]) -> FactsAndUsers:
    viewer_pk, attnames, query = _facts_and_users_query(viewer, target_ids)
    raw = await sync_to_async(_read_rows)(query) if target_ids else _NO_ROWS
    return _facts_and_users(viewer_pk, attnames, raw, query.db)


async def aexisting(target_ids: Collection[Any]) -> set[UserId]:
    """Which of these ids are users' (one query)."""
    if not target_ids:
        return set()
    query = get_user_model()._default_manager.filter(pk__in=target_ids).values_list("pk", flat=True)
    return {pk async for pk in query}


def friends_query(user_pk: Any) -> Any:
    """Ids of mutual contacts of a user with no block between them either way, in one query:
    a blocked friend is no friend to show (not even hidden in a live list)."""
    them = OuterRef("contact")
    return (
        Contact.objects.filter(owner=user_pk)
        .filter(Exists(Contact.objects.filter(owner=them, contact=user_pk)))
        .filter(~Exists(Block.objects.filter(blocker=them, blocked=user_pk)))
        .filter(~Exists(Block.objects.filter(blocker=user_pk, blocked=them)))
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
        {row[0]: _choices(row) for row in rows_query},
        {(owner, contact): close for owner, contact, close in contacts_query},
        {frozenset(pair) for pair in blocks_query},
    )
