"""Presence's own client frames: heartbeat, subscribe, unsubscribe, watch_count, unwatch_count
and set_status (docs/websocket.md), registered in the socket's frame registry
(:data:`presence.frames.FRAMES`). Recorded through :mod:`presence.lifecycle` (and
:mod:`presence.api` for status changes); subscriptions are the hub's to watch."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from django.utils.translation import gettext

from presence import api, domain, lifecycle, ratelimit, relations, stamps, users
from presence.conf import get_settings
from presence.consumers import rooms
from presence.consumers.frames import afford
from presence.consumers.limits import CLOSE_TOO_MANY_CONNECTIONS, frame_cost
from presence.consumers.state import Socket
from presence.domain import UserId
from presence.frames import FRAMES

logger = logging.getLogger("presence")


def read_user_ids(sent: tuple[int | str, ...]) -> dict[UserId, int | str]:
    """The ids of a subscribe/unsubscribe as the site's pks, each with the value the client sent
    for it (the first, if it named a user twice), or invalid_value naming the first bad one."""
    kind = users.pk_kind()
    ids: dict[UserId, int | str] = {}
    for value in sent:
        try:
            pk = users.parse_user_id(value, kind)
        except ValueError:
            raise domain.InvalidInput(
                "invalid_value",
                gettext("%(value)s is not a user id.") % {"value": repr(value)[:60]},
            ) from None
        ids.setdefault(pk, value)
    return ids


@FRAMES.handles(domain.Heartbeat)
async def heartbeat(socket: Socket, message: domain.Heartbeat) -> None:
    """A heartbeat is written (when it changes something, or half an interval after the
    last write), and a written one renews the connection's stay in its rooms."""
    if await beat(socket, message):
        await rooms.renew(socket)


async def beat(socket: Socket, message: domain.Heartbeat) -> bool:
    """Record the heartbeat; whether it was written."""
    state = socket.state
    idle = message.state is domain.HeartbeatState.IDLE
    now = time.time()
    # A session that ended where no announcement reached (deleted sessions, expiry, a
    # password set without saving the user model) ends here, on a heartbeat.
    if now - state.session_checked >= get_settings().SESSION_CHECK_INTERVAL:
        await socket.recheck_session()
        if not socket.attached:
            return False
    # A heartbeat that changes nothing, well within HEARTBEAT_INTERVAL of the last write,
    # costs Redis nothing: the connection is recorded as alive for CONNECTION_TTL anyway.
    if idle == state.idle and now - state.written_at < state.heartbeat_interval / 2:
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
        await _subscribe(socket, ids, since, stamped)
    finally:
        socket.snapshot_sent()


async def _subscribe(
    socket: Socket, ids: dict[UserId, int | str], since: str | None, stamped: bool
) -> None:
    subscriptions = socket.state.subscriptions
    sent, snapshotting = subscriptions.sent, subscriptions.snapshotting
    limits = socket.state.limits
    new = [uid for uid in ids if uid not in sent and uid not in snapshotting]
    total = len(sent) + len(snapshotting) + len(new)
    if total > limits.max_subscriptions:
        raise domain.InvalidInput(
            "too_many_subscriptions",
            gettext(
                "This would make %(total)d subscriptions; at most %(limit)d per connection. "
                "Unsubscribe from some first."
            )
            % {"total": total, "limit": limits.max_subscriptions},
        )
    # Ids of no user first, at the cost of one query for ids the process has not found
    # before: they join no channel-layer group (a frame of unknown ids would otherwise
    # cost Redis commands for each).
    existing = await relations.aexisting(new)
    known = [uid for uid in new if uid in existing]
    # Watch before reading (relations and live state), so that a change during the read
    # is delivered after it (see Hub.deliver); its frames name each user as sent.
    subscriptions.spelling.update((uid, ids[uid]) for uid in known)
    snapshotting.update(known)
    try:
        await socket.hub.watch(socket, known)
        # What the answer's stamp claims: every change made before this moment is in it.
        read_at = time.time()
        presences, guessed, unchanged = await _snapshot(socket, known, since)
    except BaseException:
        # Nothing of a failed subscribe stays watched.
        await asyncio.shield(socket.hub.unwatch(socket, known))
        subscriptions.forget_spellings(known)
        raise
    finally:
        snapshotting.difference_update(known)
    unknown = [uid for uid in new if uid not in presences and uid not in unchanged]
    # Users deleted since the existence check (or since the process found them) were
    # watched: leave them again, and check them again next time.
    deleted = [uid for uid in unknown if uid in existing]
    relations.forget_existing(deleted)
    await socket.hub.unwatch(socket, deleted)
    subscriptions.forget_spellings(unknown)
    sent.update(presences)
    # What the client shows of the unchanged is its page's: not known here, so the next
    # change the hub resolves for them is sent whatever it is (visibly_differs(None, ...)).
    sent.update(dict.fromkeys(unchanged))
    if guessed:
        # Redis could not be read: the snapshot shows what the database alone knows
        # (offline). The hub resolves these users again, retrying until Redis answers,
        # and sends a diff where the snapshot was wrong.
        socket.hub.changed(presences)
    extra = None
    if stamped:
        extra = {
            "stamp": stamps.mint(socket.viewer_id, read_at),
            "unchanged": [ids[uid] for uid in known if uid in unchanged],
        }
    await socket.send_presences("presence_state", presences, extra)
    if unknown:
        await socket.send_error(
            "unknown_users",
            gettext("No user has the id(s) %(ids)s; the others are subscribed.")
            % {"ids": ", ".join(str(ids[uid]) for uid in unknown)},
            users=[ids[uid] for uid in unknown],
        )


async def _snapshot(
    socket: Socket, known: list[UserId], since: str | None
) -> tuple[dict[UserId, domain.Presence], bool, set[UserId]]:
    """The snapshot of ``known``, whether it is a guess (Redis unreadable), and the users
    left out of it as unchanged since the stamp ``since`` (none where it proves nothing)."""
    at = None if since is None else stamps.accepted_time(since, socket.viewer_id)
    if at is not None and known:
        changed = await lifecycle.achanged_since(known, socket.viewer_id, at)
        if changed is not None:
            read = [uid for uid in known if uid in changed]
            presences, guessed = (
                await lifecycle.asnapshot(read, socket.user) if read else ({}, False)
            )
            return presences, guessed, set(known).difference(changed)
    presences, guessed = await lifecycle.asnapshot(known, socket.user)
    return presences, guessed, set()


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
    presence = await api.aapply_change(socket.user, change)
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
