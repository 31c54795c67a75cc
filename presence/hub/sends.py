"""Sending one thing to many connections: the hub's fan-outs (diffs, room diffs, the online
count).

A server that waits for its client before it takes more (uvicorn, while the client's transport
is full) holds a send up to SEND_TIMEOUT, after which the connection is closed as too slow
(presence.consumers.sending). Sent one after another, a client that reads nothing would hold up
every connection after it by that long, and a few of them each round by that long again: those
sends go at once, side by side, so a round waits one SEND_TIMEOUT at most whatever the number of
such clients, and the other connections of the round are not held. Sends to a server that never
waits (daphne) go one after another, as each returns at once (no task made per send).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

logger = logging.getLogger("presence")

C = TypeVar("C")


def sends_wait(connection: Any) -> bool:
    """Whether ``connection``'s server may hold a send (its Sender's word; a stand-in
    connection without one: no)."""
    sender = getattr(connection, "sender", None)
    return bool(getattr(sender, "waits", False))


async def to_each(
    connections: Iterable[C], send: Callable[[C], Awaitable[None]], what: str
) -> None:
    """``send(connection)`` for each; one that fails (a connection closing under us) is logged
    at debug level as ``what`` and does not stop the others."""
    waiting: list[C] = []
    for connection in connections:
        if sends_wait(connection):
            waiting.append(connection)
        else:
            await _guarded(send(connection), what)
    if len(waiting) == 1:
        await _guarded(send(waiting[0]), what)  # (alone: no one to hold up, no task)
    elif waiting:
        await asyncio.gather(*(_guarded(send(connection), what) for connection in waiting))


async def _guarded(sending: Awaitable[None], what: str) -> None:
    try:
        await sending
    except Exception:  # a connection closing must not stop the others
        logger.debug("Presence: could not send %s", what, exc_info=True)
