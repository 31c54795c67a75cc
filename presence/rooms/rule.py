"""Rooms' rules (``ROOMS``): who may enter a room, and the rules asked again for members
already inside (docs/rooms.md, "When access is taken away").

A join asks the room's rule; a member refused later (kicked from a group, lost access to a
post) must not keep their live view. Each process asks the rules again for the members of its
connections at least once per HEARTBEAT_INTERVAL (presence.hub.room_rules), once per
(user, room) whatever the number of their connections there, all in one trip to the database's
thread; and at once on :func:`recheck_room`, announced to the processes with connections in
the room through the channel layer. A member refused leaves at once, without OFFLINE_GRACE
(presence.rooms.writes.aleave_refused).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.utils.module_loading import import_string
from django.utils.translation import gettext

from presence import announce
from presence.conf import get_settings
from presence.domain.rooms import Room, parse_room
from presence.users import encode_id, user_pk

logger = logging.getLogger("presence")

RoomRule = Callable[[Any, str], Any]

#: rules' paths that did not import, logged once each
_TOLD: set[str] = set()


class UnknownRoom(LookupError):
    """A room of a kind the site did not declare in ``ROOMS`` (404 over HTTP, ``unknown_room``
    over the WebSocket)."""

    code = "unknown_room"

    def __init__(self, room: Room) -> None:
        self.room = room
        self.message = gettext("There is no room of kind %(kind)s on this site.") % {
            "kind": repr(room.kind)
        }
        super().__init__(self.message)


def room_rule(room: Room) -> RoomRule | None:
    """The ``can_enter`` of the room's kind (None: any authenticated user enters);
    :class:`UnknownRoom` for a kind ``ROOMS`` does not declare. A path that does not import is
    refused like a rule that refuses (presence.E012 reports it)."""
    kinds = get_settings().ROOMS
    if room.kind not in kinds:
        raise UnknownRoom(room)
    path = kinds[room.kind]
    if path is None:
        return None
    if callable(path):
        return path
    try:
        rule: RoomRule = import_string(path)
    except Exception:  # (not only ImportError: ".x" is a ValueError, a module may raise)
        if path not in _TOLD:
            _TOLD.add(path)
            logger.error(
                "Presence: the rule %r of room kind %r does not import; its rooms refuse "
                "everyone (see the system check presence.E012).",
                path,
                room.kind,
            )
        return _refuse
    return rule


def _refuse(user: Any, room_id: str) -> bool:
    """A kind whose rule does not import: nobody enters (until the setting is fixed)."""
    return False


def may_enter(user: Any, room: Room) -> bool:
    """Whether ``user`` may enter ``room``: authenticated, of a declared kind (else
    :class:`UnknownRoom`), and let in by the kind's rule. A rule that raises refuses, and the
    error is logged."""
    rule = room_rule(room)
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    if rule is None:
        return True
    try:
        return bool(rule(user, room.id))
    except Exception:
        logger.exception("Presence: the rule of room kind %r raised for %s", room.kind, room)
        return False


async def amay_enter(user: Any, room: Room) -> bool:
    room_rule(room)  # UnknownRoom without a thread hop
    return await sync_to_async(may_enter)(user, room)


# --- asked again ------------------------------------------------------------------------------


def needs_asking(room: Room) -> bool:
    """Whether members of ``room`` must be asked for again: its kind has a rule (None lets
    every authenticated user in, and costs nothing), or is no longer declared (refused)."""
    try:
        return room_rule(room) is not None
    except UnknownRoom:
        return True


def verdicts(asks: Sequence[tuple[Any, Room]]) -> list[bool]:
    """Whether each (user, room) may still be in the room: the rules, one call per pair, in
    the caller's thread (a kind no longer declared refuses)."""
    allowed = []
    for user, room in asks:
        try:
            allowed.append(may_enter(user, room))
        except UnknownRoom:
            allowed.append(False)
    return allowed


async def averdicts(asks: Sequence[tuple[Any, Room]]) -> list[bool]:
    """:func:`verdicts` in one trip to the database's thread."""
    if not asks:
        return []
    return await sync_to_async(verdicts)(asks)


async def arecheck_room(room: Any, users: Iterable[Any] | None = None) -> None:
    """Ask ``room``'s rule again now for these members (users or ids; all when None), in every
    process with connections in the room: a member it refuses leaves at once, gets a
    ``forbidden`` error for the room on each of their sockets, and every other view drops
    them. Raises InvalidInput for a malformed name and :class:`UnknownRoom` for a kind the
    site did not declare; a channel-layer failure is logged (the next periodic check, within
    HEARTBEAT_INTERVAL, asks anyway)."""
    name = parse_room(room)
    room_rule(name)
    ids = None if users is None else [encode_id(user_pk(user)) for user in users]
    await announce.aannounce_room_recheck(name.name, ids)


def recheck_room(room: Any, users: Iterable[Any] | None = None) -> None:
    """:func:`arecheck_room` for sync code (a view that removed someone from a group)."""
    name = parse_room(room)
    room_rule(name)
    ids = None if users is None else [encode_id(user_pk(user)) for user in users]
    announce.run_from_sync(announce.aannounce_room_recheck(name.name, ids), "a room recheck")
