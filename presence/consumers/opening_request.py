"""The subscription a socket's opening request carries (``?users=...&since=...``,
docs/websocket.md): a page view's socket is answered at connect, without a subscribe frame (one
frame and one round trip fewer); what changed since the page's stamp is read in the round trip of
the connection's opening write. Its answer and its errors are a subscribe frame's."""

from __future__ import annotations

import time
from typing import Any

from presence import domain, lifecycle
from presence.consumers import frames
from presence.consumers.limits import frame_cost
from presence.consumers.state import Socket
from presence.consumers.subscribing import UNREAD, Subscription, read_query_ids
from presence.store import Plan, Transition, merge

#: the subscription of an opening request: watched, or the error to answer instead, or none
Opening = Subscription | Exception | None


async def subscription(socket: Socket, query_string: bytes) -> Opening:
    """The subscription ``query_string`` carries, its users watched (before the opening write
    reads what changed of them); the error to answer instead; None when it carries none."""
    try:
        message = domain.parse_subscription_query(query_string, socket.state.limits)
        if message is None:
            return None
        # It weighs what a subscribe frame of as many ids weighs (RATE_LIMIT).
        socket.state.rate.allow(time.time(), frame_cost(len(message.users)))
        opened = Subscription(socket, read_query_ids(message.users), message.since, message.stamped)
        await opened.watch()
    except Exception as error:  # told to the client once the socket is open (answer)
        return error
    return opened


async def write(
    socket: Socket,
    device: domain.Device,
    check: Plan[tuple[bool, bool]] | None,
    opening: Opening,
) -> tuple[Transition | None, tuple[bool, bool] | None, Any]:
    """The connection's opening write, with ``check`` (recent logouts, presence.sessions) and the
    subscription's read of what changed since its stamp in its round trip: the transition, the
    check's answer (None without one) and who changed (UNREAD: not read)."""
    changes = opening.changes_plan() if isinstance(opening, Subscription) else None
    riders: list[Plan[Any]] = [plan for plan in (check, changes) if plan is not None]
    if not riders:
        opened = await lifecycle.aconnect(
            socket.user, socket.connection_id, device.value, socket.state.idle
        )
        return opened, None, UNREAD
    opened, answers = await lifecycle.aconnect_checking(
        socket.user, socket.connection_id, device.value, merge(riders), socket.state.idle
    )
    ends = answers[0] if check is not None else None
    changed = answers[-1] if changes is not None else UNREAD
    return opened, ends, changed


async def answer(socket: Socket, opening: Opening, changed: Any, arrived: float) -> None:
    """Answer the opening request's subscription as its subscribe frame would be answered."""

    async def work() -> None:
        try:
            if isinstance(opening, Exception):
                raise opening
            if opening is not None:
                await opening.answer(changed)
        finally:
            socket.snapshot_sent()

    # Its errors name a subscribe, as the frame's do: a client tells them from the answer of
    # its other requests.
    await frames.answer(socket, arrived, work(), answers="subscribe")
