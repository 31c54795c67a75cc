"""How many users are online: ``online_count`` for every page ("1,234 people online")."""

from __future__ import annotations

from typing import Any

from presence import resolution
from presence.operations import Operation, arun, redis, run
from presence.store import get_store
from presence.users import user_pk


def _online_count() -> Operation[int]:
    store = get_store()
    count = yield from redis(store.count_online(resolution.now()))
    return count or 0


def online_count() -> int:
    """Users online now on the whole site, invisible users left out (idle and dnd users are
    online). Cheap enough for every page: one ``ZCOUNT`` on one Redis, one round trip per
    master on a cluster (a ZCOUNT per shard), whatever the number online. It reads the online
    ledger the writes' scripts keep (the users made online and not yet offline, by the time
    each turns offline), counting those whose time is still to come: right at once after a
    transition, even before a sweep notices it. 0 when Redis is unavailable (the page renders);
    on a cluster with a master down, the users of the others."""
    return run(_online_count())


async def aonline_count() -> int:
    return await arun(_online_count())


def _note_invisible(user: Any, invisible: bool) -> Operation[None]:
    store = get_store()
    yield from redis(store.set_invisible(user_pk(user), invisible))


def note_invisible(user: Any, invisible: bool) -> None:
    """Keep the online count's copy of the user's choice to be invisible (presence.receivers
    calls it when PrivacySettings is saved or deleted; ``presence_cleanup`` puts any drift
    right)."""
    run(_note_invisible(user, invisible))


async def anote_invisible(user: Any, invisible: bool) -> None:
    await arun(_note_invisible(user, invisible))
