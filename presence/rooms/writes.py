"""Rooms, written: a connection's join, leave and renewal (recorded, then announced to the
processes with connections in the room: "these users changed in room R"), a refused member's
leave, and the sweep of members whose stay ended. Each writes in one round trip; the
announcement says who changed, never what (each process reads what its viewers may see:
presence.rooms.delta)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from presence import announce, outbox, resolution
from presence.domain import UserId
from presence.domain.rooms import Room
from presence.operations import arun, redis_then
from presence.store import Plan, StoreUnavailable, get_store, merge, merge_apart
from presence.store.plans.rooms import RoomWrite
from presence.users import user_pk

logger = logging.getLogger("presence")

T = TypeVar("T")

#: members one sweep removes from a room per round trip
PRUNE_BATCH = 1000
#: rooms one sweep takes from each schedule
ROOMS_PER_SWEEP = 200
#: rooms claimed by this process whose sweep failed (Redis went away): swept again next time
_unswept: set[str] = set()


async def _written(plan: Plan[T]) -> T:
    """Run a room write (live) and send the transitions it made (room_entered, room_left:
    presence.outbox), even if the caller is cancelled meanwhile."""
    return await arun(redis_then(plan, outbox.send_made, live=True))


async def ajoin_room(
    user: Any,
    connection_id: str,
    room: Room,
    meta: str | None,
    invisible: bool,
    public: bool = True,
) -> RoomWrite | None:
    """A connection joins ``room`` (joining again replaces its meta); announced to the room
    when what others see changed. None when Redis is unavailable. ``public``: the user shows
    their online status to everyone (store.plans.join_room)."""
    user_id = user_pk(user)
    store = get_store()
    plan = store.plans.join_room(
        room.name, user_id, connection_id, resolution.now(), meta, invisible, public=public
    )
    write = await _written(plan)
    if write is not None and write.changed:
        await announce.aannounce_room(room.name, [user_id])
    return write


async def aleave_rooms(
    user: Any, connection_id: str, rooms: Iterable[Room], at_once: bool = False
) -> None:
    """A connection leaves these rooms (one round trip); its user stays for OFFLINE_GRACE in
    a room where it was their last connection (``at_once``, a deleted user's, they leave at
    once). A room never joined changes nothing."""
    names = [room.name for room in rooms]
    if not names:
        return
    user_id = user_pk(user)
    store = get_store()
    now = resolution.now()
    writes = await _written(
        merge(
            [
                store.plans.leave_room(name, user_id, connection_id, now, at_once=at_once)
                for name in names
            ]
        )
    )
    for name, write in zip(names, writes, strict=True):
        if write is not None and write.changed:
            await announce.aannounce_room(name, [user_id])


async def arenew_rooms(
    user: Any,
    connection_id: str,
    rooms: Mapping[str, str | None],
    invisible: bool,
    public: bool = True,
) -> None:
    """A connection in these rooms (name -> its meta) is alive: their stay is renewed (one
    round trip). A room whose stay of the connection ended meanwhile (crash detection) is
    joined again, and announced."""
    if not rooms:
        return
    user_id = user_pk(user)
    store = get_store()
    now = resolution.now()
    plans = [
        store.plans.join_room(
            name, user_id, connection_id, now, meta, invisible, renew=True, public=public
        )
        for name, meta in rooms.items()
    ]
    writes = await _written(merge(plans))
    for name, write in zip(rooms, writes, strict=True):
        if write is not None and write.changed:
            await announce.aannounce_room(name, [user_id])


async def asweep_rooms(limit: int = ROOMS_PER_SWEEP) -> dict[str, list[UserId]]:
    """Remove members whose stay ended (crashed connections past CONNECTION_TTL, the end of
    OFFLINE_GRACE) from the rooms due, and announce them to each room. Each room is claimed by
    one sweeper; every live process runs this every SWEEP_INTERVAL (presence.hub)."""
    store = get_store()
    now = resolution.now()
    claimed = await store.arun(store.plans.claim_rooms(now, limit), live=True)
    rooms = list(dict.fromkeys([*_unswept, *claimed]))
    _unswept.difference_update(rooms)
    if not rooms:
        return {}
    try:
        # Each room apart: on a cluster with a master unavailable, the others' rooms are
        # swept and announced; its rooms read None.
        results = await _written(
            merge_apart([store.plans.prune_room(room, now, PRUNE_BATCH) for room in rooms])
        )
    except StoreUnavailable:
        _unswept.update(rooms)  # taken out of the schedule: kept here for the next sweep
        return {}
    pruned = {room: p for room, p in zip(rooms, results, strict=True) if p is not None}
    _unswept.update(room for room in rooms if room not in pruned)
    due = {room: p.due for room, p in pruned.items() if p.due != math.inf}
    if due and not await store.arun(store.plans.schedule_rooms(due), live=True):
        _unswept.update(due)
    gone = {room: p.gone for room, p in pruned.items() if p.gone}
    for room, users in gone.items():
        await announce.aannounce_room(room, users)
    return gone


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
    if await _written(merge(plans)) is None:
        logger.warning("Presence: %d refused room members could not be removed now", len(leaves))
    by_room: dict[str, list[UserId]] = {}
    for uid, _, room in leaves:
        by_room.setdefault(room, []).append(uid)
    for room, users in by_room.items():
        await announce.aannounce_room(room, users)
