"""The facts of many targets read with the targets' user rows, in the same one query, each value
converted only when used (``online_friends`` builds user objects for the friends it lists)."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import connections
from django.db.models import Model
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.db.models.sql.constants import MULTI

from presence import domain
from presence.domain import UserId
from presence.relations.facts import (
    FIELDS,
    Facts,
    choices_of,
    facts_query,
    reciprocal,
    relation_of,
)
from presence.users import viewer_pk as viewer_id

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


#: columns of FIELDS whose raw value may not be what Django gives (times are text on
#: SQLite); the booleans are read with bool() (0 and 1 on some databases)
_EXPIRES_AT = FIELDS.index("presence_status__expires_at")
_SEEN_AT = FIELDS.index("presence_last_seen__seen_at")
_PRIOR_SEEN_AT = FIELDS.index("presence_last_seen__prior_seen_at")


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
    #: the rows carry the viewer's own side (RECIPROCAL_LAST_SEEN)
    with_own: bool = False

    def each_fact(self) -> Iterator[tuple[UserId, tuple[domain.Relation, domain.Choices]]]:
        """Each target's (pk, (relation, choices)), as :func:`load` gives them; resolved one by
        one, thousands of facts need not be kept at once."""
        viewer_pk, with_own = self.viewer_pk, self.with_own
        convert = [
            (at, self.converters[at])
            for at in (_EXPIRES_AT, _SEEN_AT, _PRIOR_SEEN_AT)
            if at in self.converters
        ]
        for pk, row in self.rows.items():
            if convert and (row[_EXPIRES_AT] is not None or row[_SEEN_AT] is not None):
                values = list(row[: len(FIELDS)])
                for at, function in convert:
                    if values[at] is not None:
                        values[at] = function(values[at])
                yield pk, (relation_of(viewer_pk, row, pk, with_own), choices_of(values))
            else:
                yield pk, (relation_of(viewer_pk, row, pk, with_own), choices_of(row))

    @property
    def facts(self) -> Facts:
        return dict(self.each_fact())

    def users(self, ids: Iterable[UserId]) -> list[Any]:
        """The users of these ids in this order, as the user model's manager would load
        them (``Model.from_db``); ids not read are left out."""
        build, rows, db, attnames = row_builder(self.model), self.rows, self.db, self.attnames
        start = len(FIELDS)
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
        return _as_loaded(self.model, users)


def _as_loaded(model: Any, users: list[Any]) -> list[Any]:
    """``users`` as the manager's loading leaves them beyond ``from_db``'s defaults: with the
    fetch mode of its queryset (Django 6.1+; Django's default otherwise, and a site's other mode
    lost), sharing one list of peers where that mode fetches for all the users read together."""
    fetch_mode = getattr(model._default_manager.get_queryset(), "_fetch_mode", None)
    if fetch_mode is None:  # Django < 6.1
        return users
    peers = [weakref.ref(user) for user in users] if fetch_mode.track_peers else None
    for user in users:
        user._state.fetch_mode = fetch_mode
        if peers is not None:
            user._state.peers = peers
    return users


def row_builder(model: Any) -> Callable[[str, tuple[str, ...], list[Any]], Any]:
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
    """Whether building ``model`` by hand makes what ``Model.from_db`` makes (see row_builder)."""
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
        with_own=reciprocal(),
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


#: ids this process has found to be users' (aexisting), at most KNOWN_IDS of them: users are
#: seldom deleted, and a deleted one's id is caught by the snapshot read after the check, which
#: leaves it out (the consumer then calls forget_existing)
_known: dict[Any, None] = {}
KNOWN_IDS = 65536


async def aexisting(target_ids: Collection[Any]) -> set[UserId]:
    """Which of these ids are users' (one query for those not found before in this process, none
    when all were: a page view's socket subscribes to users the process's other sockets did)."""
    found = {pk for pk in target_ids if pk in _known}
    asked = [pk for pk in target_ids if pk not in found]
    if not asked:
        return found
    query = get_user_model()._default_manager.filter(pk__in=asked).values_list("pk", flat=True)
    new = {pk async for pk in query}
    if len(_known) + len(new) > KNOWN_IDS:
        _known.clear()
    _known.update(dict.fromkeys(new))
    return found | new


def forget_existing(target_ids: Iterable[Any]) -> None:
    """Ids found to be no user's after all (deleted since :func:`aexisting` found them)."""
    for pk in target_ids:
        _known.pop(pk, None)
