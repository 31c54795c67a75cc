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
_tidied_at: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, float] = (
    weakref.WeakKeyDictionary()
)


async def tidy_database_connections() -> None:
    """``close_old_connections`` in the database thread, once per TIDY_INTERVAL per event loop:
    a connection that broke or outlived ``CONN_MAX_AGE`` is replaced within a second."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    if now - _tidied_at.get(loop, -TIDY_INTERVAL) < TIDY_INTERVAL:
        return
    _tidied_at[loop] = now
    await sync_to_async(close_old_connections)()
