"""Sending one thing to many connections: the hub's fan-outs (presence diffs, room diffs, the
room states of a refresh, the online count).

A server that waits for its client before it takes more (uvicorn, while the client's transport
is full) holds a send up to SEND_TIMEOUT, after which the connection is closed as too slow
(presence.consumers.sending). Sends to a server that never waits (daphne) go one after another,
as each returns at once (no task made per send). To a server that waits, every fan-out goes
through the hub's one :class:`InOrder`: each connection's sends in a task of their own, after
the ones asked for it before, whichever fan-out asked (a refresh's room_state before the
room_diffs made from it, the diffs of a connection in the order of their rounds), and a round
waits for them ROUND_WAIT at most. A client that reads nothing holds up no other connection's
frames, in its round or any later one, of any fan-out: it waits behind its own send alone.
What waited is looked at again when it goes (each fan-out's ``send`` does): a frame the
connection's own answers made stale meanwhile (a snapshot, a join's room_state, a count asked
again) is not sent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

logger = logging.getLogger("presence")

C = TypeVar("C")

#: the longest a round waits for the sends it started (InOrder.send): a client that reads has
#: been handed its frames by then; the sends of one that does not go on in their own tasks
ROUND_WAIT = 0.05


def sends_wait(connection: Any) -> bool:
    """Whether ``connection``'s server may hold a send (its Sender's word; a stand-in
    connection without one: no)."""
    sender = getattr(connection, "sender", None)
    return bool(getattr(sender, "waits", False))


async def _guarded(sending: Awaitable[None], what: str) -> None:
    try:
        await sending
    except Exception:  # a connection closing must not stop the others
        logger.debug("Presence: could not send %s", what, exc_info=True)


class InOrder:
    """Sends to each connection in the order asked, which the asker does not wait for long."""

    def __init__(self) -> None:
        #: each connection's sends under way, in order (each goes after the one before it)
        self._queued: dict[Any, list[asyncio.Future[None]]] = {}

    def busy(self, connection: Any) -> bool:
        """Whether sends asked for ``connection`` are still under way."""
        return connection in self._queued

    def drop(self, connection: Any) -> None:
        """``connection`` closed: what is still to go to it does not (nor waits for it)."""
        for task in self._queued.pop(connection, ()):
            task.cancel()

    async def send(
        self, connections: Iterable[C], send: Callable[[C], Awaitable[None]], what: str
    ) -> None:
        """``send(connection)`` for each (one that fails, a connection closing under us, is
        logged at debug level as ``what`` and does not stop the others), each connection's
        after the sends asked for it before (its frames keep their order), and not waited for
        past ROUND_WAIT: where the server may wait, each send is a task of its own, and one
        queued behind an earlier send still under way (a client that reads nothing) is not
        waited for at all."""
        started: list[asyncio.Future[None]] = []
        queued = self._queued
        for connection in connections:
            if not sends_wait(connection):
                await _guarded(send(connection), what)  # returns at once: no task
                continue
            before = queued.get(connection)
            task = asyncio.ensure_future(
                _after(before[-1] if before else None, send, connection, what)
            )
            if before:
                before.append(task)
            else:
                queued[connection] = [task]
                started.append(task)
            task.add_done_callback(functools.partial(self._sent, connection))
        if started:
            # Not cancelled at the end of the wait, nor with the asker: they go on, in order.
            await asyncio.wait(started, timeout=ROUND_WAIT)

    def _sent(self, connection: Any, task: asyncio.Future[None]) -> None:
        tasks = self._queued.get(connection)
        if tasks is not None and task in tasks:
            tasks.remove(task)
            if not tasks:
                del self._queued[connection]


async def _after(
    before: asyncio.Future[None] | None,
    send: Callable[[C], Awaitable[None]],
    connection: C,
    what: str,
) -> None:
    if before is not None:
        await asyncio.wait({before})  # it raises nothing (guarded), or was cancelled
    await _guarded(send(connection), what)
