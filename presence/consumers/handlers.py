"""Presence's own client frames: heartbeat, subscribe, unsubscribe and set_status
(docs/websocket.md). Recorded through :mod:`presence.lifecycle` (and :mod:`presence.api` for
status changes); subscriptions are the hub's to watch."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from django.utils.translation import gettext

from presence import api, domain, lifecycle, ratelimit, relations, users
from presence.conf import get_settings
from presence.consumers.credentials import Credentials
from presence.consumers.frames import FrameDispatch, handles
from presence.consumers.limits import CLOSE_TOO_MANY_CONNECTIONS, frame_cost
from presence.domain import UserId

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


class PresenceFrames(FrameDispatch, Credentials):
    """The frames of presence itself, on a connection the hub delivers presences to."""

    @handles(domain.Heartbeat)
    async def heartbeat(self, message: domain.Heartbeat) -> None:
        idle = message.state is domain.HeartbeatState.IDLE
        now = time.time()
        # A session that ended where no announcement reached (deleted sessions, expiry, a
        # password set without saving the user model) ends here, on a heartbeat.
        if now - self.session_checked >= get_settings().SESSION_CHECK_INTERVAL:
            await self.recheck_session()
            if not self.attached:
                return
        # A heartbeat that changes nothing, well within HEARTBEAT_INTERVAL of the last write,
        # costs Redis nothing: the connection is recorded as alive for CONNECTION_TTL anyway.
        if idle == self.idle and now - self.written_at < self.heartbeat_interval / 2:
            return
        written = await lifecycle.aheartbeat(self.user, self.connection_id, self.device.value, idle)
        if await self._refused(written):
            return
        if written is not None:
            # Only a recorded beat counts: one the store answered with its fallback (Redis
            # slow or down) leaves the next beat to write, a change of state included.
            self.written_at = now
            self.idle = idle

    async def _refused(self, transition: Any) -> bool:
        """Close a connection the store refused (MAX_CONNECTIONS_PER_USER): nothing of it was
        recorded, so nothing is closed in Redis either."""
        if transition is None or not transition.refused:
            return False
        logger.info("Presence: closing connection of user %s: too many connections", self.viewer_id)
        self.attached = False
        await self.hub.detach(self)
        await self.close(code=CLOSE_TOO_MANY_CONNECTIONS)
        return True

    @handles(domain.Subscribe)
    async def subscribe_frame(self, message: domain.Subscribe) -> None:
        # Ids cost work each: a large subscribe counts as several frames.
        if await self.afford(frame_cost(len(message.users))):
            await self.subscribe(read_user_ids(message.users))

    @handles(domain.Unsubscribe)
    async def unsubscribe_frame(self, message: domain.Unsubscribe) -> None:
        if await self.afford(frame_cost(len(message.users))):
            await self.unsubscribe(read_user_ids(message.users))

    async def subscribe(self, ids: dict[UserId, int | str]) -> None:
        new = [uid for uid in ids if uid not in self.sent and uid not in self.snapshotting]
        total = len(self.sent) + len(self.snapshotting) + len(new)
        if total > self.limits.max_subscriptions:
            raise domain.InvalidInput(
                "too_many_subscriptions",
                gettext(
                    "This would make %(total)d subscriptions; at most %(limit)d per connection. "
                    "Unsubscribe from some first."
                )
                % {"total": total, "limit": self.limits.max_subscriptions},
            )
        # Ids of no user first, at the cost of one query for ids the process has not found
        # before: they join no channel-layer group (a frame of unknown ids would otherwise
        # cost Redis commands for each).
        existing = await relations.aexisting(new)
        known = [uid for uid in new if uid in existing]
        # Watch before reading (relations and live state), so that a change during the read
        # is delivered after it (see Hub.deliver); its frames name each user as sent.
        self.spelling.update((uid, ids[uid]) for uid in known)
        self.snapshotting.update(known)
        try:
            await self.hub.watch(self, known)
            presences, guessed = await lifecycle.asnapshot(known, self.user)
        except BaseException:
            # Nothing of a failed subscribe stays watched.
            await asyncio.shield(self.hub.unwatch(self, known))
            self._forget_spellings(known)
            raise
        finally:
            self.snapshotting.difference_update(known)
        unknown = [uid for uid in new if uid not in presences]
        # Users deleted since the existence check (or since the process found them) were
        # watched: leave them again, and check them again next time.
        deleted = [uid for uid in unknown if uid in existing]
        relations.forget_existing(deleted)
        await self.hub.unwatch(self, deleted)
        self._forget_spellings(unknown)
        self.sent.update(presences)
        if guessed:
            # Redis could not be read: the snapshot shows what the database alone knows
            # (offline). The hub resolves these users again, retrying until Redis answers,
            # and sends a diff where the snapshot was wrong.
            self.hub.changed(presences)
        await self.send_presences("presence_state", presences)
        if unknown:
            await self.send_error(
                "unknown_users",
                gettext("No user has the id(s) %(ids)s; the others are subscribed.")
                % {"ids": ", ".join(str(ids[uid]) for uid in unknown)},
                users=[ids[uid] for uid in unknown],
            )

    def _forget_spellings(self, user_ids: list[UserId]) -> None:
        for uid in user_ids:
            if uid not in self.sent:
                self.spelling.pop(uid, None)

    async def unsubscribe(self, ids: dict[UserId, int | str]) -> None:
        subscribed = [uid for uid in ids if uid in self.sent]
        for uid in subscribed:
            del self.sent[uid]
        self._forget_spellings(subscribed)
        await self.hub.unwatch(self, subscribed)

    @handles(domain.WatchCount)
    async def watch_count_frame(self, message: domain.WatchCount) -> None:
        await self.hub.counts.watch(self)

    @handles(domain.UnwatchCount)
    async def unwatch_count_frame(self, message: domain.UnwatchCount) -> None:
        self.hub.counts.discard(self)

    @handles(domain.SetStatus)
    async def set_status_frame(self, message: domain.SetStatus) -> None:
        await self.set_status(message.change)

    async def set_status(self, change: domain.StatusChange) -> None:
        if await self.over_write_limit():
            return
        presence = await api.aapply_change(self.user, change)
        await self.send_json({"type": "status", "presence": presence.as_dict()})

    async def over_write_limit(self) -> bool:
        """Count one write of this user against HTTP_RATE_LIMIT, the per-user budget that HTTP
        writes share (so another socket, or a reconnect, brings no fresh one); past it the
        client is told ``rate_limited`` with ``retry_after`` and nothing is written. Frames an
        installed app adds that write call it too (presence.extensions)."""
        wait = await ratelimit.aretry_after(self.user)
        if wait is None:
            return False
        await self.send_error("rate_limited", ratelimit.limited_message(wait), retry_after=wait)
        return True
