"""Closing the database connections that broke or outlived ``CONN_MAX_AGE``, at most once per
TIDY_INTERVAL per process instead of before every message as Channels would."""

from __future__ import annotations

import asyncio
import weakref

from asgiref.sync import sync_to_async
from django.db import close_old_connections

#: how often, at most, the consumers of a process close database connections that are past
#: CONN_MAX_AGE or broken (django.db.close_old_connections), in seconds
TIDY_INTERVAL = 1.0
#: per event loop, when each database thread ("sockets", "writes") was last tidied
_tidied_at: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, float]] = (
    weakref.WeakKeyDictionary()
)


async def tidy_database_connections(thread: str = "sockets") -> None:
    """``close_old_connections`` in the database thread this call's ``sync_to_async`` reaches
    (``thread`` names it: the sockets' one, or presence.consumers.writes's), once per
    TIDY_INTERVAL per event loop: a connection that broke or outlived ``CONN_MAX_AGE`` is
    replaced within a second."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    tidied = _tidied_at.setdefault(loop, {})
    if now - tidied.get(thread, -TIDY_INTERVAL) < TIDY_INTERVAL:
        return
    tidied[thread] = now
    await sync_to_async(close_old_connections)()
