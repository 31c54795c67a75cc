"""Contacts and blocks read alone, without the privacy facts: a viewer's ties (a room's read
lists their contacts first, leaves out whoever a block stands between, and looks up the users
whose contact list or exceptions may show them to the viewer), the blocks of many
users and the contacts of many owners among some users (a room's live delta), and whether a
user chose to be invisible (a connection's rooms carry the flag). Their SQL is written here
(and the fan-out's pairs', presence.relations.pairs)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import connections, router
from django.db.models import Model, Q

from presence.domain import UserId, Visibility
from presence.models import Block, Contact, PrivacyException, PrivacySettings, privacy_defaults


class Ties(NamedTuple):
    """A viewer's ties, as a room's read uses them."""

    #: the viewer's contacts (listed first)
    contacts: set[UserId]
    #: the users a block stands between the viewer and either way (neither listed nor counted)
    blocked: set[UserId]
    #: the users who may show their online status to this viewer beyond "everyone": those
    #: who have the viewer among their contacts, and those with an "always share" exception
    #: of their online status for the viewer (the resolver still decides)
    admitting: set[UserId]
    #: the owners of any privacy exception naming the viewer (any setting, allow or not):
    #: what they show the viewer may differ from what they show a stranger
    excepting: set[UserId]


#: Django's integer fields, whose values the database gives as Python ints
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


def _user_ids() -> Callable[[Any], Any] | None:
    """How a user id read by SQL written here becomes the one the ORM gives: None for an
    integer key (as it is: a dense contact list's hundreds of rows are not converted one by
    one), else the key's ``to_python`` (a UUID stored as text on SQLite becomes a UUID)."""
    pk: Any = get_user_model()._meta.pk
    if pk.get_internal_type() in _INTEGER_FIELDS:
        return None
    return pk.to_python


class Statement:
    """SQL written here for a model's rows, with its parameters: the relations' statements
    name hundreds of ids, and building them through the ORM (its lookups, a union's
    compilation) cost ten times what running them did, on the database's thread that a
    fan-out or a burst of joins keeps busy."""

    def __init__(self, model: type[Model]) -> None:
        self.model = model
        self.connection = connections[router.db_for_read(model)]
        self.quote = self.connection.ops.quote_name
        self.table = self.quote(model._meta.db_table)

    def column(self, field_name: str) -> str:
        field: Any = self.model._meta.get_field(field_name)  # a concrete field: it has a column
        return f"{self.table}.{self.quote(field.column)}"

    def named(self, field_name: str, ids: Collection[Any], params: list[Any]) -> str:
        """``field IN (ids)``, the ids appended to ``params``. Integer ids are handed to the
        database as they are (preparing each through the field cost a few microseconds, for
        a thousand viewers longer than the query); other ids (UUIDs, strings) are prepared by
        the field, once each."""
        field: Any = self.model._meta.get_field(field_name)
        values = list(ids)
        integers = field.target_field.get_internal_type() in _INTEGER_FIELDS
        if not (integers and all(type(value) is int for value in values)):
            values = [field.get_db_prep_value(value, self.connection) for value in values]
        params += values
        return f"{self.column(field_name)} IN ({', '.join(['%s'] * len(values))})"

    def rows(self, sql: str, params: list[Any], ids: tuple[int, ...]) -> list[tuple[Any, ...]]:
        """The rows of ``sql``, the user ids in the columns ``ids`` as the ORM gives them."""
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        as_id = _user_ids()
        if as_id is None:
            return rows
        return [
            tuple(as_id(value) if n in ids else value for n, value in enumerate(row))
            for row in rows
        ]


def viewer_ties(viewer_id: Any) -> Ties:
    """The viewer's :class:`Ties`: one query of six index lookups (:func:`ties_of`)."""
    ties = Ties(set(), set(), set(), set())
    for kind, _, user_id in _ties_rows([viewer_id]):
        ties[kind].add(user_id)
    return ties


def ties_of(viewers: Collection[UserId]) -> dict[UserId, Ties]:
    """:func:`viewer_ties` of many viewers (a batch of a room's joins), in one query."""
    found = {viewer: Ties(set(), set(), set(), set()) for viewer in viewers}
    if found:
        for kind, viewer, user_id in _ties_rows(list(found)):
            found[viewer][kind].add(user_id)
    return found


def _ties_rows(viewers: list[Any]) -> list[tuple[int, Any, Any]]:
    """``(kind, viewer, user)`` of each tie of these viewers (kinds: _build_ties_sql), the
    ids as the ORM gives them. Its SQL is built once
    per database and number of viewers: building it with the ORM each time cost ten times the
    query, which runs on every join."""
    contact = Statement(Contact)
    connection = contact.connection
    key = (connection.alias, len(viewers))
    sql = _ties_sql.get(key)
    if sql is None:
        if len(_ties_sql) >= 64:
            _ties_sql.clear()
        sql = _ties_sql[key] = _build_ties_sql(connection, len(viewers))
    prep = Contact._meta.get_field("owner").get_db_prep_value
    params = [prep(viewer, connection) for viewer in viewers]
    return contact.rows(sql, [*params * 5, "online_visibility", True, *params], ids=(1, 2))


#: the SQL of _ties_rows, by database alias and number of viewers
_ties_sql: dict[tuple[str, int], str] = {}


def _build_ties_sql(connection: Any, count: int) -> str:
    """For each of ``count`` viewers: their contacts (0), the other side of each block either
    way (1), the owners of a contact row of the viewer or of an "always share" exception
    of their online status for the viewer (2), and the owners of any exception for the viewer
    (3), from the models' tables and columns."""
    quote = connection.ops.quote_name
    contact, block, exception = Contact._meta, Block._meta, PrivacyException._meta

    def column(meta: Any, name: str) -> str:
        return str(quote(meta.get_field(name).column))

    contacts, blocks = quote(contact.db_table), quote(block.db_table)
    blocker, blocked = column(block, "blocker"), column(block, "blocked")
    owner, of = column(contact, "owner"), column(contact, "contact")
    exceptions = quote(exception.db_table)
    viewer = column(exception, "viewer")
    among = f"IN ({', '.join(['%s'] * count)})"
    return (
        f"SELECT 0, {owner}, {of} FROM {contacts} WHERE {owner} {among} "
        f"UNION ALL SELECT 1, {blocker}, {blocked} FROM {blocks} WHERE {blocker} {among} "
        f"UNION ALL SELECT 1, {blocked}, {blocker} FROM {blocks} WHERE {blocked} {among} "
        f"UNION ALL SELECT 2, {of}, {owner} FROM {contacts} WHERE {of} {among} "
        f"UNION ALL SELECT 2, {viewer}, {column(exception, 'owner')} FROM {exceptions} "
        f"WHERE {viewer} {among} AND {column(exception, 'setting')} = %s "
        f"AND {column(exception, 'allow')} = %s "
        f"UNION ALL SELECT 3, {viewer}, {column(exception, 'owner')} FROM {exceptions} "
        f"WHERE {viewer} {among}"
    )


def blocks_rows(user_ids: Collection[Any]) -> list[tuple[Any, Any]]:
    """``(blocker, blocked)`` of every block either of whose users is one of ``user_ids``:
    one statement (a room's delivery asks it for every viewer of the room: through the ORM,
    2,000 viewers' ids cost 20 ms of building against 3 ms of running it)."""
    block = Statement(Block)
    params: list[Any] = []
    by_blocker = block.named("blocker", user_ids, params)
    by_blocked = block.named("blocked", user_ids, params)
    pair = f"{block.column('blocker')}, {block.column('blocked')}"
    return block.rows(
        f"SELECT {pair} FROM {block.table} WHERE {by_blocker} "
        f"UNION SELECT {pair} FROM {block.table} WHERE {by_blocked}",
        params,
        ids=(0, 1),
    )


def blocks_between(viewers: Collection[UserId]) -> dict[UserId, set[UserId]]:
    """Each viewer's counterparts in a block either way: one query (:func:`blocks_rows`)."""
    counterparts: dict[UserId, set[UserId]] = {}
    wanted = set(viewers)
    if not wanted:
        return counterparts
    for one, other in blocks_rows(wanted):
        if one in wanted:
            counterparts.setdefault(one, set()).add(other)
        if other in wanted:
            counterparts.setdefault(other, set()).add(one)
    return counterparts


def contacts_among(
    owners: Collection[UserId], users: Collection[UserId]
) -> dict[UserId, set[UserId]]:
    """Each owner's contacts among ``users``: one query."""
    found: dict[UserId, set[UserId]] = {}
    if not owners or not users:
        return found
    rows = Contact.objects.filter(Q(owner__in=owners), Q(contact__in=users)).values_list(
        "owner_id", "contact_id"
    )
    for owner, contact in rows:
        found.setdefault(owner, set()).add(contact)
    return found


def contacts_of(owners: Collection[UserId]) -> dict[UserId, set[UserId]]:
    """Each owner's contacts, all of them: one query."""
    found: dict[UserId, set[UserId]] = {}
    ids: list[Any] = list(owners)  # (the ORM's stubs type a pk lookup by the model's pk)
    if ids:
        for owner, contact in Contact.objects.filter(owner__in=ids).values_list(
            "owner_id", "contact_id"
        ):
            found.setdefault(owner, set()).add(contact)
    return found


def is_invisible(user_id: Any) -> bool:
    """Whether the user chose to be invisible (their PrivacySettings row says so)."""
    return PrivacySettings.objects.filter(user=user_id, invisible=True).exists()


async def ais_invisible(user_id: UserId) -> bool:
    return await sync_to_async(is_invisible)(user_id)


def shown_flags(user_id: Any) -> tuple[bool, bool]:
    """Whether the user chose to be invisible, and whether their online status is shown to
    everyone (their level "everyone", or the site's DEFAULT_PRIVACY without a row): the two
    flags a room holds of its members. One query."""
    row = (
        PrivacySettings.objects.filter(user=user_id)
        .values_list("invisible", "online_visibility")
        .first()
    )
    default = privacy_defaults().online_visibility.value
    if row is None:
        return False, default == Visibility.EVERYONE.value
    return bool(row[0]), (row[1] or default) == Visibility.EVERYONE.value


async def ashown_flags(user_id: UserId) -> tuple[bool, bool]:
    return await sync_to_async(shown_flags)(user_id)
