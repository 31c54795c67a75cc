"""Admission of opening sockets: a process works on at most OPENINGS_AT_ONCE sockets' openings at
once; the others, accepted already, wait their turn: each user's in the order they came, the
users in turn.

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

One account must not queue ahead of everyone: first come, first served let 200 sockets of one
user, each holding its place until OPENING_HOLD, delay another user's first snapshot by seconds.
So a socket enters the process's count of its user's sockets before it waits (:func:`enter`:
past MAX_CONNECTIONS_PER_USER here it is refused at once, without a place or a Redis round
trip), a user holds at most PLACES_PER_USER places at once, and a freed place goes to the user
waiting who holds the fewest, the one who waited longest among them (round robin by user), to
that user's first socket waiting. A refused socket gives its place back at once.

A socket that has to wait is recorded live in Redis before it waits, and its heartbeats are
written while it waits (the consumer's ``_wait_turn``): in a reconnect storm its user's previous
connection, on the process that died, expires CONNECTION_TTL after its last heartbeat, and a
storm longer than that took every user still waiting offline and back online again, announced
to all their watchers (signals, fan-out, resumed views no longer unchanged) while the process
was busiest. It costs one write per waiting socket, and per HEARTBEAT_INTERVAL of its wait
(with a read of the credential's recent logouts: a logged-out socket keeps nobody online).

While sockets wait for a place (every one of OPENINGS_AT_ONCE taken), the process is busy with
openings: a room's joins then gather for GATHER_WHILE_WAITING before each batch
(:func:`gather_while_waiting`, the hub's rooms' joins, presence.rooms.joins), so that a batch
reads the room, its members' facts and the rule once for many joiners instead of one or two (a
batch's work grows little with each joiner more). A join waits that long more, only then;
without sockets waiting for a place (one account's sockets past its own places do not count)
no delay is added.

A slot is given back once the socket's first subscribe was answered (its snapshot sent) or its
first join arrived (the join goes on in its room's batch, presence.rooms.joins, whose work grows
little with each joiner more), when it closes or is refused, or OPENING_HOLD seconds after it
was admitted (a client that sends neither), whichever comes first.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque

from presence.conf import get_settings
from presence.domain import UserId

#: the places one user's openings may hold at once (of OPENINGS_AT_ONCE)
PLACES_PER_USER = 3
#: seconds a room's joins gather before each batch while sockets wait for a place
GATHER_WHILE_WAITING = 0.4

#: each event loop's gate (a process's sockets share one loop)
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Gate] = weakref.WeakKeyDictionary()


class Slot:
    """One admitted opening; :meth:`release` gives the place to the next socket in turn (once:
    further calls do nothing)."""

    def __init__(self, gate: Gate, user_id: UserId, hold: float) -> None:
        self._gate: Gate | None = gate
        self._user_id = user_id
        self._timer = asyncio.get_running_loop().call_later(hold, self.release)

    @property
    def held(self) -> bool:
        return self._gate is not None

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            self._timer.cancel()
            gate.give_back(self._user_id)


class Entry:
    """One socket of a user counted in this process, from before its opening until it ends;
    :meth:`leave` (once: further calls do nothing) takes it out of the count."""

    def __init__(self, gate: Gate, user_id: UserId) -> None:
        self._gate: Gate | None = gate
        self.user_id = user_id

    def must_wait(self) -> bool:
        """Whether this socket would wait for its turn if it asked now (the places are taken,
        or its user holds PLACES_PER_USER of them)."""
        assert self._gate is not None, "a socket that left does not wait"
        return self._gate.must_wait(self.user_id)

    async def admit(self) -> Slot:
        """Wait for this socket's turn among the openings."""
        assert self._gate is not None, "a socket that left is not admitted"
        return await self._gate.admit(self.user_id)

    def leave(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.left(self.user_id)


class Gate:
    """A process's (event loop's) openings: the places in use and each user's, the sockets
    waiting by user, and each user's sockets here. OPENINGS_AT_ONCE is read at each turn (a
    changed setting applies from the next one)."""

    def __init__(self) -> None:
        self.in_use = 0
        self.held: dict[UserId, int] = {}
        #: each user's sockets waiting, in the order they came
        self.queues: dict[UserId, deque[asyncio.Future[None]]] = {}
        #: the users waiting who may take a place, by the places they hold: the fewest first,
        #: then in the order they lined up there (a dict as an ordered set). A user lines up
        #: again, at the end, whenever the places it holds change: round robin by user.
        self.turns: list[dict[UserId, None]] = [{} for _ in range(PLACES_PER_USER)]
        self.sockets: dict[UserId, int] = {}

    def enter(self, user_id: UserId) -> Entry | None:
        """Count a new socket of ``user_id``; None (not counted) when the user has
        MAX_CONNECTIONS_PER_USER sockets here already: the store would refuse it anyway."""
        count = self.sockets.get(user_id, 0)
        if count >= get_settings().MAX_CONNECTIONS_PER_USER:
            return None
        self.sockets[user_id] = count + 1
        return Entry(self, user_id)

    def left(self, user_id: UserId) -> None:
        count = self.sockets.pop(user_id) - 1
        if count:
            self.sockets[user_id] = count

    @property
    def waiting(self) -> bool:
        """Whether sockets wait for the process's places (every place taken): a user in a line
        of ``turns`` could take a free one. Sockets waiting only because their user holds
        PLACES_PER_USER places (one account's tabs) do not count."""
        return any(self.turns)

    def must_wait(self, user_id: UserId) -> bool:
        self._serve()
        limit = get_settings().OPENINGS_AT_ONCE
        return self.in_use >= limit or self.held.get(user_id, 0) >= PLACES_PER_USER

    async def admit(self, user_id: UserId) -> Slot:
        # Once _serve is done, no user waiting may take a free place: a newcomer takes it.
        self._serve()  # (places added by a raised OPENINGS_AT_ONCE go to those waiting first)
        limit = get_settings().OPENINGS_AT_ONCE
        if self.in_use < limit and self.held.get(user_id, 0) < PLACES_PER_USER:
            self._hold(user_id, +1)
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            queue = self.queues.get(user_id)
            if queue is None:
                queue = self.queues[user_id] = deque()
                self._line_up(user_id)
            queue.append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self.give_back(user_id)  # given the place, but gone before taking it
                else:
                    self._forget(user_id, turn)
                raise
        return Slot(self, user_id, get_settings().OPENING_HOLD)

    def give_back(self, user_id: UserId) -> None:
        self._hold(user_id, -1)
        self._serve()

    def _hold(self, user_id: UserId, change: int) -> None:
        """``user_id`` takes (+1) or gives back (-1) a place; it lines up again by its count."""
        held = self.held.pop(user_id, 0)
        if held < PLACES_PER_USER:
            self.turns[held].pop(user_id, None)
        self.in_use += change
        held += change
        if held:
            self.held[user_id] = held
        self._line_up(user_id)

    def _line_up(self, user_id: UserId) -> None:
        held = self.held.get(user_id, 0)
        if user_id in self.queues and held < PLACES_PER_USER:
            self.turns[held][user_id] = None

    def _forget(self, user_id: UserId, turn: asyncio.Future[None]) -> None:
        queue = self.queues.get(user_id)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self.queues[user_id]
                for line in self.turns:
                    line.pop(user_id, None)

    def _serve(self) -> None:
        """Free places to the users waiting in turn, each to the user's first socket waiting."""
        limit = get_settings().OPENINGS_AT_ONCE
        while self.in_use < limit:
            line = next((line for line in self.turns if line), None)
            if line is None:
                return
            user_id = next(iter(line))
            queue = self.queues[user_id]
            turn = queue.popleft()
            if not queue:
                del self.queues[user_id]
            if turn.done():  # cancelled: its socket's task has yet to hear of it
                if user_id not in self.queues:
                    del line[user_id]
                continue
            self._hold(user_id, +1)  # out of its line; in the next one if it has more waiting
            turn.set_result(None)


def gate() -> Gate:
    """The running event loop's gate."""
    loop = asyncio.get_running_loop()
    found = _gates.get(loop)
    if found is None:
        found = _gates[loop] = Gate()
    return found


def openings_waiting() -> bool:
    """Whether sockets of the running event loop wait for a place to open (a reconnect storm,
    a burst of page views: every place among OPENINGS_AT_ONCE taken)."""
    found = _gates.get(asyncio.get_running_loop())
    return found is not None and found.waiting


async def gather_while_waiting() -> None:
    """Wait GATHER_WHILE_WAITING while sockets wait for a place to open, else return at once:
    what a room's join batches await before each batch (see the module's doc)."""
    if openings_waiting():
        await _pause(GATHER_WHILE_WAITING)


#: what gather_while_waiting waits with (tests wait for an event of theirs instead of the clock)
_pause = asyncio.sleep


def enter(user_id: UserId) -> Entry | None:
    """Count a new socket of ``user_id`` in this process (see :meth:`Gate.enter`)."""
    return gate().enter(user_id)


async def admit(user_id: UserId) -> Slot:
    """Wait for a place among the openings in progress (each user's in the order they came, the
    users in turn); for a socket not counted by :func:`enter` (tests, tools)."""
    return await gate().admit(user_id)
