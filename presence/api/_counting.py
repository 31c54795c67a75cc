"""How many users are online: ``online_count`` for every page ("1,234 people online")."""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

from presence import copies, resolution
from presence.operations import Operation, arun, redis, run
from presence.store import PresenceStore, get_store
from presence.users import user_pk

logger = logging.getLogger("presence")

#: how old a count shown live may be: the hub reads it once per this many seconds per process
#: and sends a socket at most one update per interval; the JSON endpoint answers this
#: process's reading of the last interval
COUNT_INTERVAL = 5.0


def _online_count(live: bool = False) -> Operation[int | None]:
    store = get_store()
    count: int | None = yield from redis(store.plans.count_online(resolution.now()), live)
    return count


def online_count() -> int:
    """Users online now on the whole site, invisible users left out (idle and dnd users are
    online). Cheap enough for every page: one ``ZCOUNT`` on one Redis, one round trip per
    master on a cluster (a ZCOUNT per shard), whatever the number online. It reads the online
    ledger the writes' scripts keep (the users made online and not yet offline, by the time
    each turns offline), counting those whose time is still to come: right at once after a
    transition, even before a sweep notices it. 0 when Redis is unavailable (the page renders);
    on a cluster with a master down, the users of the others."""
    return run(_online_count()) or 0


async def aonline_count() -> int:
    return await arun(_online_count()) or 0


async def alive_online_count() -> int | None:
    """:func:`aonline_count` on the live path (the hub's one reading per COUNT_INTERVAL): it
    waits for a busy Redis, and answers None (not 0) when Redis cannot be read."""
    return await arun(_online_count(live=True))


#: each store's (this process's) last readings: name -> (when, count)
_recent: weakref.WeakKeyDictionary[PresenceStore, dict[str, tuple[float, int]]] = (
    weakref.WeakKeyDictionary()
)


def fresh_reading(name: str) -> int | None:
    """This process's reading of ``name`` made within COUNT_INTERVAL, or None."""
    recent = _recent.get(get_store(), {}).get(name)
    # A clock that went backwards (now < then) reads again.
    if recent is not None and 0 <= time.time() - recent[0] < COUNT_INTERVAL:
        return recent[1]
    return None


def keep_reading(name: str, count: int | None) -> int:
    """Remember a reading of ``name`` (None: Redis could not be read, nothing to keep); the
    count to answer (0 for None)."""
    if count is None:
        return 0
    _recent.setdefault(get_store(), {})[name] = (time.time(), count)
    return count


def recent_online_count() -> int:
    """:func:`online_count` as this process read it within COUNT_INTERVAL (read now if it did
    not): what ``GET presence/api/online_count`` answers, so that any number of pollers cost
    Redis one read per process per interval."""
    count = fresh_reading("online")
    if count is None:
        count = keep_reading("online", run(_online_count()))
    return count


def note_invisible(user: Any, invisible: bool) -> None:
    """Keep the online count's copy of the user's choice to be invisible (presence.receivers
    calls it when PrivacySettings is saved or deleted, after commit: ``invisible`` what the
    caller committed). Written as given, then checked against the database (a change
    committed meanwhile is written again), and written again later if Redis does not take it
    now or the database cannot be read (presence.copies); ``presence_cleanup`` puts any other
    drift right. Never raises (an ``on_commit`` hook's failure would fail the committed save)."""
    user_id = user_pk(user)
    copies.after_commit(copies.write_invisible(user_id, invisible), [user_id])


async def anote_invisible(user: Any, invisible: bool) -> None:
    user_id = user_pk(user)
    try:
        await arun(copies.write_invisible(user_id, invisible))
    except Exception:
        logger.exception("Presence: copying user %s's choice to Redis failed", user_id)
        copies.later([user_id])
