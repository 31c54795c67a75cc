"""A room's announcements from one event loop, sent one message at a time: the users announced
while the room's previous message is being sent go together in the next one.

A burst of joins made each join its own "these users changed in room R": 1,000 joins from a
process were 1,000 group_sends (the layer's round trips and the announcing process's CPU),
and 1,000 messages that every process with views of the room received one by one (a backlog
seconds long behind which the next announcements waited). Nothing waits for more users to
come: an announcement alone goes out as soon as it is made (one loop round later), and one made
meanwhile waits only for the message before it.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

#: users in one message at most (a longer queue goes in several, one after another)
MAX_USERS = 1000

Send = Callable[[str, list[Any], float], Awaitable[None]]


class _Queued:
    """A room's users waiting for its next message, the earliest change among them, and the
    callers waiting for that message to be sent."""

    def __init__(self) -> None:
        self.users: dict[Any, None] = {}
        self.at = math.inf
        self.waiting: list[asyncio.Future[None]] = []


#: event loop -> room -> what waits for the room's next message (while one is being sent)
_queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Queued]] = (
    weakref.WeakKeyDictionary()
)
_senders: set[asyncio.Task[None]] = set()


async def send(room: str, users: list[Any], at: float, sender: Send) -> None:
    """``sender(room, users, at)``, with the users of ``room`` announced meanwhile on this
    loop (``at``: the earliest of theirs, so that coalescing windows count from the first
    change); returns once a message carrying ``users`` was sent."""
    if not users:
        # Nothing to announce (every join of a batch found its user in the room already, as
        # after a restart): no message, and no caller left waiting for one never sent.
        return
    loop = asyncio.get_running_loop()
    rooms = _queues.setdefault(loop, {})
    queued = rooms.get(room)
    if queued is None:
        queued = rooms[room] = _Queued()
        task = asyncio.ensure_future(_drain(rooms, room, queued, sender))
        _senders.add(task)
        task.add_done_callback(_senders.discard)
    queued.users.update(dict.fromkeys(users))
    queued.at = min(queued.at, at)
    sent: asyncio.Future[None] = loop.create_future()
    queued.waiting.append(sent)
    # A caller cancelled meanwhile does not take the others' message down with it.
    await asyncio.shield(sent)


async def _drain(rooms: dict[str, _Queued], room: str, queued: _Queued, sender: Send) -> None:
    try:
        while queued.users:
            users = list(queued.users)[:MAX_USERS]
            for user in users:
                del queued.users[user]
            at = queued.at
            if queued.users:
                waiting: list[asyncio.Future[None]] = []  # answered with the queue's last part
            else:
                waiting, queued.waiting, queued.at = queued.waiting, [], math.inf
            try:
                await sender(room, users, at)
            except Exception as error:
                # A sender that raised (presence's never does): its callers are told so, and
                # the users queued meanwhile go in the next message.
                _settle(waiting, error)
                continue
            except BaseException:
                queued.waiting += waiting  # cancelled below, not left waiting
                raise
            _settle(waiting)
    finally:
        # Nothing is queued after the last check (no await since): the next announcement of
        # the room starts a new message at once.
        if rooms.get(room) is queued:
            del rooms[room]
        for sent in queued.waiting:  # cancelled (the loop closing): nobody waits forever
            if not sent.done():
                sent.cancel()


def _settle(waiting: list[asyncio.Future[None]], error: Exception | None = None) -> None:
    for sent in waiting:
        if sent.done():
            continue
        if error is None:
            sent.set_result(None)
        else:
            sent.set_exception(error)
