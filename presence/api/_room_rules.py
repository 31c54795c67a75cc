"""Rooms' rules asked again for members already inside (docs/rooms.md, "Who stays").

A join asks the room's rule; a member refused later (kicked from a group, lost access to a
post) must not keep their live view. Each process asks the rules again for the members of its
connections at least once per HEARTBEAT_INTERVAL (presence.hub.room_rules), once per
(user, room) whatever the number of their connections there, all in one trip to the database's
thread; and at once on :func:`recheck_room`, announced to the processes with connections in
the room through the channel layer. A member refused leaves at once, without OFFLINE_GRACE
(:func:`aleave_refused`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from asgiref.sync import sync_to_async

from presence import announce, resolution
from presence.api._rooms import UnknownRoom, may_enter, room_rule
from presence.domain import UserId
from presence.domain.rooms import Room, parse_room
from presence.store import get_store, merge
from presence.users import encode_id, user_pk

logger = logging.getLogger("presence")


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


async def aleave_refused(leaves: Iterable[tuple[UserId, str, str]]) -> None:
    """These (user, connection id, room) leave at once, without OFFLINE_GRACE (one round trip),
    and each room is told of its refused users (they are no longer present once their last
    connection left, wherever it was). Redis unavailable: logged; the connections no longer
    renew their stay, which ends within CONNECTION_TTL."""
    leaves = list(leaves)
    if not leaves:
        return
    store = get_store()
    now = resolution.now()
    plans = [store.plans.leave_room(room, uid, cid, now, at_once=True) for uid, cid, room in leaves]
    if await store.arun(merge(plans), live=True) is None:
        logger.warning("Presence: %d refused room members could not be removed now", len(leaves))
    by_room: dict[str, list[UserId]] = {}
    for uid, _, room in leaves:
        by_room.setdefault(room, []).append(uid)
    for room, users in by_room.items():
        await announce.aannounce_room(room, users)


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
