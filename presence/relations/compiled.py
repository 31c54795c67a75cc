"""The facts query (:func:`~presence.relations.facts.facts_query`) compiled once per process and
shape, then run as SQL with the ids of each call: building and compiling its subqueries, cases
and annotations cost more than the query itself (a page view's subscribe reads 50 users' facts;
most of its CPU was Django building the same SQL again).

The SQL is compiled with stand-in ids (:func:`_stand_ins`), whose places among the parameters
tell where a call's viewer and targets go. Target lists are padded to a few sizes (the first id
repeated: ``IN`` does not care), so that a handful of shapes serve every call. A shape whose
stand-ins cannot be placed (a primary key of an unforeseen kind, a database that inlines
parameters) is not cached: the queryset runs as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connections
from django.db.models import IntegerField, UUIDField

#: target lists longer than this are not padded nor cached (rare: the friends lists have their
#: own query); sizes are powers of two up to it
LARGEST = 1024
_BASE = 7_340_000_000_000


@dataclass(frozen=True)
class Compiled:
    """One shape of the facts query: its SQL, what each parameter is (``-1``: the viewer,
    ``n >= 0``: the n-th target, None: a constant of ``constants``) and Django's converters
    by column."""

    sql: str
    slots: tuple[int | None, ...]
    constants: tuple[Any, ...]
    converters: tuple[tuple[int, tuple[Callable[..., Any], ...], Any], ...]
    size: int


def padded_size(count: int) -> int | None:
    """The size a list of ``count`` targets is padded to, or None past :data:`LARGEST`."""
    if count > LARGEST:
        return None
    size = 1
    while size < count:
        size *= 2
    return size


def _stand_ins(field: Any, count: int) -> list[Any] | None:
    """``count + 1`` values of the user model's primary key that no parameter of the query
    has otherwise (the viewer's first), or None for a key of another kind."""
    if isinstance(field, UUIDField):
        return [uuid.UUID(int=_BASE + n) for n in range(count + 1)]
    if isinstance(field, IntegerField):  # the auto fields too
        # Small enough for any integer column, negative: no user's.
        return [-(1_000_000_000 + n) for n in range(count + 1)]
    return None


def compile_facts(
    alias: str, viewer: bool, reciprocal: bool, size: int, build: Callable[..., Any]
) -> Compiled | None:
    """The facts query of ``size`` targets (``build(viewer_pk, target_ids)``: facts_query)
    compiled for the database ``alias``, or None when it cannot be cached."""
    key = (alias, get_user_model(), viewer, reciprocal, size, build)
    if key not in _compiled:
        if len(_compiled) >= 64:
            _compiled.clear()
        _compiled[key] = _compile(*key)
    return _compiled[key]


#: the shapes compiled so far, by (alias, user model, viewer or not, reciprocal, size, builder)
_compiled: dict[tuple[Any, ...], Compiled | None] = {}


def _compile(
    alias: str, model: Any, viewer: bool, reciprocal: bool, size: int, build: Callable[..., Any]
) -> Compiled | None:
    connection = connections[alias]
    pk_field = model._meta.pk
    stand_ins = _stand_ins(pk_field, size)
    if stand_ins is None:
        return None
    viewer_pk, targets = (stand_ins[0] if viewer else None), stand_ins[1:]
    query = build(viewer_pk, targets).using(alias)
    compiler = query.query.get_compiler(using=alias)
    sql, params = compiler.as_sql()
    if compiler.has_extra_select or list(query._fields) != [
        *query.query.values_select,
        *query.query.annotation_select,
    ]:
        return None  # pragma: no cover - facts_query asks for its columns in this order
    prep = pk_field.get_db_prep_value
    prepared = {prep(value, connection): n - 1 for n, value in enumerate(stand_ins)}
    slots: list[int | None] = []
    constants: list[Any] = []
    for param in params:
        try:
            slot = prepared.get(param)
        except TypeError:  # an unhashable constant
            slot = None
        slots.append(slot)
        constants.append(None if slot is not None else param)
    found = [slot for slot in slots if slot is not None]
    # Each target once (its IN), the viewer wherever it is named: else the SQL is not ours.
    if sorted(s for s in found if s >= 0) != list(range(size)) or (viewer and -1 not in found):
        return None
    expressions = [selected[0] for selected in compiler.select[: compiler.col_count]]
    converters = tuple(
        (position, tuple(functions), expression)
        for position, (functions, expression) in compiler.get_converters(expressions).items()
    )
    return Compiled(sql, tuple(slots), tuple(constants), converters, size)


def _ints_as_they_are(pk_field: Any, connection: Any, ids: list[Any]) -> bool:
    """Whether ``ids`` are integers the database takes as they are (SQLite, MySQL: an
    integer key's prepared value is the integer; PostgreSQL's driver wraps it in its type)."""
    if not isinstance(pk_field, IntegerField) or not all(type(pk) is int for pk in ids):
        return False
    prepared = pk_field.get_db_prep_value(ids[0], connection)
    return type(prepared) is int and prepared == ids[0]


def run_compiled(
    compiled: Compiled, alias: str, viewer_pk: Any, target_ids: Collection[Any]
) -> list[Sequence[Any]]:
    """The rows of ``compiled`` for this viewer and these targets (each value as Django's
    values_list would give it). Blocking: the database's thread."""
    connection = connections[alias]
    pk_field = get_user_model()._meta.pk
    ids = list(target_ids)
    ids += [ids[0]] * (compiled.size - len(ids))
    prep = pk_field.get_db_prep_value
    if _ints_as_they_are(pk_field, connection, ids):
        values = ids  # (no call per target: a room's read prepares a hundred)
    else:
        values = [prep(pk, connection) for pk in ids]
    viewer = prep(viewer_pk, connection) if viewer_pk is not None else None
    params = [
        constant if slot is None else (viewer if slot < 0 else values[slot])
        for slot, constant in zip(compiled.slots, compiled.constants, strict=True)
    ]
    with connection.cursor() as cursor:
        cursor.execute(compiled.sql, params)
        rows = cursor.fetchall()
    if not compiled.converters or not rows:
        return rows
    # Column by column: a room's hundred rows hold None in most converted columns (no status,
    # no last seen row, no tie), and a column of None is passed whole (row by row, every row
    # went through every converter: a tenth of a room's read).
    columns: list[Sequence[Any]] = list(zip(*rows, strict=True))
    for position, functions, expression in compiled.converters:
        column = columns[position]
        if column.count(None) == len(column):
            continue
        values = []
        for value in column:
            # (the facts' columns are presence's fields and annotations, whose converters all
            # keep None)
            if value is not None:
                for function in functions:
                    value = function(value, expression, connection)
            values.append(value)
        columns[position] = values
    return list(zip(*columns, strict=True))
