"""Short pauses of Python's garbage collector in a process holding many sockets.

A full collection walks every container object of the process, and the event loop waits for
it: every socket's frames, announcements and diffs. A socket holds a few hundred such objects
(Channels', Twisted's and presence's), so a process with 3,300 sockets held about 800,000, and
each full collection stopped it for about a second, every 10 to 20 s under load
(docs/deployment.md).

:func:`collect_in_short_pauses` has each full collection walk only what came since the last
one: what survived a full collection is frozen (``gc.freeze``), and every ``unfreeze_every``
seconds a full collection walks everything again (unfrozen first), to find the cyclic garbage
among the long-lived objects, which waits until then. Objects freed by their reference count
(most of them) are freed at once, frozen or not.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

__all__ = ["collect_in_short_pauses", "stop_collecting_in_short_pauses"]

#: the default period of the full collections that walk everything (seconds)
UNFREEZE_EVERY = 300.0

_installed: list[Callable[[str, dict[str, Any]], None]] = []


def collect_in_short_pauses(
    unfreeze_every: float = UNFREEZE_EVERY, clock: Callable[[], float] = time.monotonic
) -> None:
    """From now on, a full collection walks only what is younger than the last one, except
    one every ``unfreeze_every`` seconds, which walks everything. Call it once, at the end of
    your ``asgi.py`` (calling it again replaces the period)."""
    if unfreeze_every <= 0:
        raise ValueError(
            f"unfreeze_every must be a positive number of seconds, not {unfreeze_every!r}"
        )
    stop_collecting_in_short_pauses()
    walked_all_at = clock()

    def around_collections(phase: str, info: dict[str, Any]) -> None:
        nonlocal walked_all_at
        if info["generation"] != 2:
            return
        if phase == "start":
            if clock() - walked_all_at >= unfreeze_every:
                walked_all_at = clock()
                gc.unfreeze()  # into the oldest generation: this collection walks it all
        else:
            gc.freeze()

    gc.callbacks.append(around_collections)
    _installed.append(around_collections)


def stop_collecting_in_short_pauses() -> bool:
    """Back to Python's own collections (what is frozen stays frozen, as after
    ``gc.freeze()``); whether they were short until now."""
    was_installed = bool(_installed)
    while _installed:
        callback = _installed.pop()
        if callback in gc.callbacks:
            gc.callbacks.remove(callback)
    return was_installed
