"""The thread that reads the oracle's truth (``bulk_presence``, ``room_presence``), at a lower
priority, and how often differing views are compared again: shared by the harness's presence
checks and the rooms' (tools/loadtest/harness.py, tools/loadtest/rooms.py)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

#: differing views are compared again this often, at most (seconds) ...
RECHECK = 0.5
#: ... and so that those reads take at most this share of the time
ORACLE_SHARE = 0.25
#: the niceness of the thread that reads the oracle's truth: on a small machine the harness
#: shares the cores with the servers it measures, and its checks must not take their time
ORACLE_NICENESS = 10
_oracle_thread: ThreadPoolExecutor | None = None


def _lower_this_threads_priority() -> None:
    # Linux keeps a niceness per thread: only the oracle's reads are lowered, not the harness's
    # other threads, nor the processes it starts later (a restarted server).
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), ORACLE_NICENESS)


def in_oracle_thread(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in the oracle's thread of lower priority."""
    global _oracle_thread
    if _oracle_thread is None:
        _oracle_thread = ThreadPoolExecutor(1, "oracle", initializer=_lower_this_threads_priority)
    return _oracle_thread.submit(function, *args).result()
