"""A per-user limit on writes (posting, joining or leaving groups, status changes), shared by
every process through one small Redis counter per user and window.

The WebSocket has its own per-connection limit on frames (``RATE_LIMIT``, close code 4429);
this one guards the database against one account flooding it, whatever the way in: the HTTP
endpoints, the settings page, the writes made over a WebSocket (``set_status``) and a site's own
forms and buttons, which count theirs with :func:`retry_after` (docs/api.md), count alike.
``HTTP_RATE_LIMIT = (requests, seconds)``: at most ``requests`` writes of one user in each
fixed window of ``seconds`` (windows start at multiples of ``seconds`` since the epoch, so a
burst across a window boundary may reach twice the limit: simple, and one round trip).
When Redis is unavailable the limit fails open: writes go on, as with the rest of presence.
"""

from __future__ import annotations

import math
import time
from typing import Any

from django.utils.translation import ngettext

from presence.conf import get_settings
from presence.domain import UserId
from presence.operations import Operation, arun, redis, run
from presence.store import Plan, PresenceStore, get_store
from presence.users import encode_id, user_pk


def counter_plan(store: PresenceStore, user_id: UserId, now: float) -> Plan[int | None]:
    """Count one write of ``user_id`` in the window of ``now``: the count so far, or None when
    Redis is unavailable (the caller lets the write through)."""
    limit = get_settings().HTTP_RATE_LIMIT
    assert limit is not None
    return _window_count_plan(store, "http-rate", user_id, 1, limit[1], now)


def _window_count_plan(
    store: PresenceStore, counter: str, user_id: UserId, weight: int, seconds: int, now: float
) -> Plan[int | None]:
    """Add ``weight`` to the user's ``counter`` in the fixed window of ``now``: the count so
    far, or None when Redis is unavailable."""
    window = math.floor(now / seconds)
    key = f"{store.conf.KEY_PREFIX}:{counter}:{encode_id(user_id)}:{window}"
    return Plan(
        # The key names its window, so the expiry only cleans up (a second of slack for clocks).
        commands=[("INCRBY", key, weight), ("EXPIRE", key, seconds + 1)],
        parse=lambda replies: int(replies[0]),
        fallback=None,
    )


def _count_write(user: Any, live: bool) -> Operation[int | None]:
    limit = get_settings().HTTP_RATE_LIMIT
    if limit is None:
        return None
    now = time.time()
    store = get_store()
    counted = yield from redis(counter_plan(store, user_pk(user), now), live)
    return _verdict(counted, limit, now)


def retry_after(user: Any) -> int | None:
    """Count one write of ``user``: None when it is allowed, else the whole seconds until the
    current window ends (the ``Retry-After`` of a 429). Fails open when Redis is down or
    ``HTTP_RATE_LIMIT`` is None. Public: a site's own form or button calls it before its write
    (the Python API counts nothing), and answers :func:`limited_message` past the limit."""
    return run(_count_write(user, live=False))


async def aretry_after(user: Any) -> int | None:
    """:func:`retry_after` for the WebSocket: writes made over a socket (status changes, and
    what they record) count against the same per-user counter as HTTP's, so neither a socket
    nor a reconnect brings a fresh budget."""
    return await arun(_count_write(user, live=True))


def limited_message(wait: int) -> str:
    """What a write past the limit is answered, over HTTP (a 429) and over the WebSocket."""
    return ngettext(
        "Too many changes in a short time; try again in %(seconds)d second.",
        "Too many changes in a short time; try again in %(seconds)d seconds.",
        wait,
    ) % {"seconds": wait}


def _verdict(count: int | None, limit: tuple[int, int], now: float) -> int | None:
    """None when ``count`` is within the ``(budget, seconds)`` window (or unknown: Redis down),
    else the whole seconds until the window of ``now`` ends."""
    budget, seconds = limit
    if count is None or count <= budget:
        return None
    window_end = (math.floor(now / seconds) + 1) * seconds
    return max(1, math.ceil(window_end - now))


# --- reads: HTTP_READ_LIMIT -------------------------------------------------------------------

#: the least a read counts for, in ids: each request pays its queries and its round trip whatever
#: it asks, so a flood of one-id reads is metered too
READ_MIN_IDS = 25


def read_counter_plan(
    store: PresenceStore, user_id: UserId, weight: int, now: float
) -> Plan[int | None]:
    """Add a read of ``weight`` ids by ``user_id`` to the window of ``now``: the ids counted so
    far, or None when Redis is unavailable (the caller lets the read through)."""
    limit = get_settings().HTTP_READ_LIMIT
    assert limit is not None
    return _window_count_plan(store, "http-read", user_id, weight, limit[1], now)


def read_retry_after(user: Any, ids: int) -> int | None:
    """Count a read of ``ids`` distinct user ids by ``user`` (``GET presence/api/presence``):
    None when it is within ``HTTP_READ_LIMIT``, else the whole seconds until the current window
    ends (the ``Retry-After`` of a 429). A read counts as at least READ_MIN_IDS ids and at most
    the whole budget (so one read of the most ids allowed passes in a fresh window). Fails open
    when Redis is down or ``HTTP_READ_LIMIT`` is None."""
    limit = get_settings().HTTP_READ_LIMIT
    if limit is None:
        return None
    weight = min(max(ids, READ_MIN_IDS), limit[0])
    now = time.time()
    store = get_store()
    counted = store.run(read_counter_plan(store, user_pk(user), weight, now))
    return _verdict(counted, limit, now)
