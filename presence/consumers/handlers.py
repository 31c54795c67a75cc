"""Presence's own client frames: heartbeat, subscribe, unsubscribe, watch_count, unwatch_count
and set_status (docs/websocket.md), registered in the socket's frame registry
(:data:`presence.frames.FRAMES`). Recorded through :mod:`presence.lifecycle` (and
:mod:`presence.api` for status changes); subscriptions are the hub's to watch."""

from __future__ import annotations

import logging
import time
from typing import Any

from presence import api, domain, lifecycle, ratelimit
from presence.conf import get_settings
from presence.consumers import restamping, rooms
from presence.consumers.frames import afford
from presence.consumers.limits import CLOSE_TOO_MANY_CONNECTIONS, frame_cost
from presence.consumers.state import Socket
from presence.consumers.subscribing import Subscription, read_user_ids
from presence.consumers.writes import in_writes_thread
from presence.domain import UserId, passed
from presence.frames import FRAMES

logger = logging.getLogger("presence")


@FRAMES.handles(domain.Heartbeat)
async def heartbeat(socket: Socket, message: domain.Heartbeat) -> None:
    """A heartbeat is written (when it changes something, or half an interval after the
    last write), and a written one renews the connection's stay in its rooms; it may bring a
    fresh stamp (presence.consumers.restamping)."""
    if await beat(socket, message):
        await rooms.renew(socket)
    # A client holding a stamp two heartbeats old gets a fresh one (presence.consumers.restamping).
    await restamping.heartbeat(socket, time.time())


async def beat(socket: Socket, message: domain.Heartbeat) -> bool:
    """Record the heartbeat; whether it was written."""
    state = socket.state
    idle = message.state is domain.HeartbeatState.IDLE
    now = time.time()
    # A session that ended where no announcement reached (deleted sessions, expiry, a
    # password set without saving the user model) ends here, on a heartbeat.
    if passed(now, state.session_checked, get_settings().SESSION_CHECK_INTERVAL):
        await socket.recheck_session()
        if not socket.attached:
            return False
    # A heartbeat that changes nothing, well within HEARTBEAT_INTERVAL of the last write,
    # costs Redis nothing: the connection is recorded as alive for CONNECTION_TTL anyway.
    if idle == state.idle and not passed(now, state.written_at, state.heartbeat_interval / 2):
        return False
    written = await lifecycle.aheartbeat(
        socket.user, socket.connection_id, state.device.value, idle
    )
    if await close_refused(socket, written):
        return False
    if written is None:
        return False
    # Only a recorded beat counts: one the store answered with its fallback (Redis slow or
    # down) leaves the next beat to write, a change of state included.
    state.written_at = now
    state.idle = idle
    return True


async def close_refused(socket: Socket, transition: Any) -> bool:
    """Close a connection the store refused (MAX_CONNECTIONS_PER_USER): nothing of it was
    recorded, so nothing is closed in Redis either."""
    if transition is None or not transition.refused:
        return False
    logger.info("Presence: closing connection of user %s: too many connections", socket.viewer_id)
    socket.attached = False
    await socket.hub.detach(socket)
    await socket.close(code=CLOSE_TOO_MANY_CONNECTIONS)
    return True


@FRAMES.handles(domain.Subscribe)
async def subscribe_frame(socket: Socket, message: domain.Subscribe) -> None:
    # Ids cost work each: a large subscribe counts as several frames.
    if await afford(socket, frame_cost(len(message.users))):
        await subscribe(
            socket, read_user_ids(message.users), since=message.since, stamped=message.stamped
        )


@FRAMES.handles(domain.Unsubscribe)
async def unsubscribe_frame(socket: Socket, message: domain.Unsubscribe) -> None:
    if await afford(socket, frame_cost(len(message.users))):
        await unsubscribe(socket, read_user_ids(message.users))


async def subscribe(
    socket: Socket, ids: dict[UserId, int | str], since: str | None = None, stamped: bool = False
) -> None:
    """Subscribe to ``ids`` and send their snapshot. ``stamped``: the client sent ``since``
    (a stamp, or None); the snapshot then carries a fresh stamp and lists the users left out as
    ``unchanged`` since ``since`` (docs/websocket.md, "Stamps")."""
    try:
        subscription = Subscription(socket, ids, since, stamped)
        await subscription.watch()
        await subscription.answer()
    finally:
        socket.snapshot_sent()


async def unsubscribe(socket: Socket, ids: dict[UserId, int | str]) -> None:
    subscriptions = socket.state.subscriptions
    subscribed = [uid for uid in ids if uid in subscriptions.sent]
    for uid in subscribed:
        del subscriptions.sent[uid]
    subscriptions.forget_spellings(subscribed)
    await socket.hub.unwatch(socket, subscribed)


@FRAMES.handles(domain.WatchCount)
async def watch_count_frame(socket: Socket, message: domain.WatchCount) -> None:
    await socket.hub.counts.watch(socket)


@FRAMES.handles(domain.UnwatchCount)
async def unwatch_count_frame(socket: Socket, message: domain.UnwatchCount) -> None:
    socket.hub.counts.discard(socket)


@FRAMES.handles(domain.SetStatus)
async def set_status_frame(socket: Socket, message: domain.SetStatus) -> None:
    await set_status(socket, message.change)


async def set_status(socket: Socket, change: domain.StatusChange) -> None:
    if await over_write_limit(socket):
        return
    presence = await in_writes_thread(api.aapply_change(socket.user, change))
    await socket.send_json({"type": "status", "presence": presence.as_dict()})


async def over_write_limit(socket: Socket) -> bool:
    """Count one write of this user against HTTP_RATE_LIMIT, the per-user budget that HTTP
    writes share (so another socket, or a reconnect, brings no fresh one); past it the client
    is told ``rate_limited`` with ``retry_after`` and nothing is written. Frames an installed
    app adds that write call it too (``connection.over_write_limit()``, presence.extensions)."""
    wait = await ratelimit.aretry_after(socket.user)
    if wait is None:
        return False
    await socket.send_error("rate_limited", ratelimit.limited_message(wait), retry_after=wait)
    return True
