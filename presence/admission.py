"""Admission of opening sockets: a process works on at most OPENINGS_AT_ONCE sockets' openings at
once; the others, accepted already, wait their turn in the order they came.

A socket's opening (joining the hub, the opening write to Redis, the first subscribe's relations
query and snapshot) is the most expensive thing a process does. When every client of a restarted
process reconnects within seconds (a reconnect storm), thousands of openings at once made every
one of them slow: the database thread queued the handshakes' user lookups behind the snapshots'
queries until daphne dropped handshakes (not accepted within 5 s), Redis's pooled connections were
all held by openings waiting for the event loop ("every pooled connection busy"), heartbeats and
deliveries of the sockets already open waited behind them, and the clients dropped came back to
start over. Admitted a few at a time, each opening takes what it costs alone, the live work keeps
its turn, and a socket waiting for its turn costs nothing but its place in the queue: it was
accepted (the handshake is not held), and its first frames wait in its own queue meanwhile.

A slot is given back once the socket's first subscribe was answered (its snapshot sent), when it
closes, or OPENING_HOLD seconds after it was admitted (a client that subscribes to nothing),
whichever comes first.
"""

from __future__ import annotations

import asyncio
import weakref

from presence.conf import get_settings

#: each event loop's gate and the limit it was made for (a process's sockets share one loop)
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


class Slot:
    """One admitted opening; :meth:`release` gives the place to the next socket waiting (once:
    further calls do nothing)."""

    def __init__(self, gate: asyncio.Semaphore, hold: float) -> None:
        self._gate: asyncio.Semaphore | None = gate
        self._timer = asyncio.get_running_loop().call_later(hold, self.release)

    @property
    def held(self) -> bool:
        return self._gate is not None

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            self._timer.cancel()
            gate.release()


def gate() -> asyncio.Semaphore:
    """The running event loop's gate, of OPENINGS_AT_ONCE places (a new gate once the setting
    changed; slots of the old one give their places back to it)."""
    loop = asyncio.get_running_loop()
    limit = get_settings().OPENINGS_AT_ONCE
    found = _gates.get(loop)
    if found is None or found[0] != limit:
        found = _gates[loop] = (limit, asyncio.Semaphore(limit))
    return found[1]


async def admit() -> Slot:
    """Wait for a place among the openings in progress (first come, first served)."""
    entrance = gate()
    await entrance.acquire()
    return Slot(entrance, get_settings().OPENING_HOLD)
