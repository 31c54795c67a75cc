"""A socket's own writes (``set_status`` frames) do their database work in a thread of their
own, one per process: a change the user made does not wait behind the queries of every socket
opening on the sockets' thread (sessions, users, privacy facts). Reads stay on the sockets'
thread; the hub's deliveries have a thread of their own too (presence.hub.delivery)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from asgiref.sync import ThreadSensitiveContext
from django.db import connections

from presence.consumers.tidy import tidy_database_connections

T = TypeVar("T")

#: whether this asgiref's ThreadSensitiveContext may be given the executor its calls run in
_GIVEN_EXECUTORS = "executor" in inspect.signature(ThreadSensitiveContext).parameters

logger = logging.getLogger("presence")

#: writes under way, held until they end (their callers may be gone)
_running: set[asyncio.Future[Any]] = set()
_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _writes_executor() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="presence-writes")
        return _executor


async def in_writes_thread(write: Coroutine[Any, Any, T]) -> T:
    """``write`` awaited with its database calls in the writes' thread (where asgiref cannot
    be told an executor, in the sockets' thread as before). It runs to its end even if the
    caller is cancelled (the socket closed): what it writes is announced, and none of its
    calls outlives the thread's context."""
    if not _GIVEN_EXECUTORS:
        return await write

    async def in_its_thread() -> T:
        async with ThreadSensitiveContext(executor=_writes_executor()):
            # That thread's connection replaced within a second once it broke or outlived
            # CONN_MAX_AGE, as the sockets' thread's is.
            await tidy_database_connections("writes")
            return await write

    task = asyncio.ensure_future(in_its_thread())
    _running.add(task)
    task.add_done_callback(_finished)
    return await asyncio.shield(task)


def _finished(task: asyncio.Future[Any]) -> None:
    _running.discard(task)
    if not task.cancelled() and task.exception() is not None:
        # Raised to its caller too, unless the caller was cancelled meanwhile: then only here.
        logger.debug("Presence: a socket's write failed", exc_info=task.exception())


def close_connections() -> None:
    """Close the writes' thread's database connections (blocks until done): a test's end, so
    that the test database can be flushed and dropped, or a process shutting down."""
    executor = _executor
    if executor is not None:
        executor.submit(connections.close_all).result()


def _forget_after_fork() -> None:
    global _executor, _lock
    _executor, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
