"""The WebSocket consumer at ``ws/presence/`` (protocol: CONTRACT.md and README "WebSocket").

A thin edge: frames are validated by :func:`presence.domain.parse_frame`, recorded through
:mod:`presence.api`, and fanned out by the process's :class:`presence.live.Hub`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import deque
from typing import Any
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncWebsocketConsumer
from django.utils.translation import gettext

from presence import api, domain, extensions
from presence.conf import get_settings
from presence.live import Hub
from presence.store import get_store

logger = logging.getLogger("presence")

#: close codes (CONTRACT.md)
CLOSE_UNAUTHENTICATED = 4401
CLOSE_RATE_LIMITED = 4429


class RateLimit:
    """At most ``frames`` frames in any ``seconds``-long window (a sliding log)."""

    def __init__(self, frames: int, seconds: float) -> None:
        self.frames = frames
        self.seconds = seconds
        self._times: deque[float] = deque()

    def allow(self, now: float) -> bool:
        while self._times and self._times[0] <= now - self.seconds:
            self._times.popleft()
        if len(self._times) >= self.frames:
            return False
        self._times.append(now)
        return True


def _device(scope: dict[str, Any]) -> tuple[domain.Device, str | None]:
    """The device kind from ``?device=``, else guessed from the User-Agent; and an error for
    an unknown kind (the guess is used then)."""
    headers = dict(scope.get("headers") or [])
    guess = domain.device_from_user_agent(headers.get(b"user-agent", b"").decode("latin-1") or None)
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    asked = query.get("device", [None])[0]
    if asked is None:
        return guess, None
    try:
        return domain.Device(asked), None
    except ValueError:
        return guess, gettext(
            "Unknown device %(device)s: use web, mobile or desktop; using %(guess)s."
        ) % {"device": repr(asked[:20]), "guess": guess.value}


class PresenceConsumer(AsyncWebsocketConsumer):
    # The process's hub is the one channel-layer listener; a connection needs no channel (and
    # no Redis receive) of its own. No such alias exists, so Channels gives it none.
    channel_layer_alias = "presence.hub-only"

    viewer_id: int
    sent: dict[int, domain.Presence]
    snapshotting: set[int]

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()
        if user is None or not user.is_authenticated:
            # Accepted first, so that browsers see the code (a refused handshake is only 1006).
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        conf = get_settings()
        self.user = user
        self.viewer_id = int(user.pk)
        self.connection_id = uuid.uuid4().hex[:16]
        self.device, device_error = _device(self.scope)
        self.idle = False
        self.limits = api.limits()
        self.rate = RateLimit(*conf.RATE_LIMIT)
        self.sent = {}
        self.snapshotting = set()
        self.hub = Hub.get()
        await self.hub.attach(self)
        self.attached = True
        if device_error:
            await self.send_error("invalid_value", device_error)
        await api.aheartbeat(self.user, self.connection_id, self.device.value)

    async def disconnect(self, code: int) -> None:
        if not getattr(self, "attached", False):
            return
        self.attached = False
        await self.hub.detach(self)
        await api.adisconnect(self.user, self.connection_id)

    # --- frames -------------------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not getattr(self, "attached", False):
            return
        if not self.rate.allow(time.time()):
            logger.info("Presence: closing connection of user %s: rate limit", self.viewer_id)
            await self.close(code=CLOSE_RATE_LIMITED)
            await self.disconnect(CLOSE_RATE_LIMITED)
            return
        try:
            message = domain.parse_frame(text_data, self.limits, extensions.frame_parsers())
            if isinstance(message, domain.Heartbeat):
                await self.heartbeat(message)
            elif isinstance(message, domain.Subscribe):
                await self.subscribe(message.users)
            elif isinstance(message, domain.Unsubscribe):
                await self.unsubscribe(message.users)
            elif isinstance(message, domain.SetStatus):
                await self.set_status(message.change)
            else:  # a frame type an installed app added (presence.extensions)
                await extensions.frame_handler(message.type)(self, message.message)
        except domain.InvalidInput as error:
            await self.send_error(error.code, error.message)

    async def heartbeat(self, message: domain.Heartbeat) -> None:
        self.idle = message.state is domain.HeartbeatState.IDLE
        await api.aheartbeat(self.user, self.connection_id, self.device.value, self.idle)

    async def subscribe(self, users: tuple[int, ...]) -> None:
        new = [uid for uid in users if uid not in self.sent and uid not in self.snapshotting]
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
        # Watch before reading, so that a change during the read is delivered after it.
        self.snapshotting.update(new)
        await self.hub.watch(self, new)
        try:
            presences = await api.abulk_presence(new, self.user)
            # Read at once: after a failure the store leaves Redis alone for RETRY_INTERVAL, so
            # nothing can clear the flag in between.
            guessed = get_store().health.in_outage
        finally:
            self.snapshotting.difference_update(new)
        unknown = [uid for uid in new if uid not in presences]
        await self.hub.unwatch(self, unknown)
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
                % {"ids": ", ".join(map(str, unknown))},
                users=unknown,
            )

    async def unsubscribe(self, users: tuple[int, ...]) -> None:
        subscribed = [uid for uid in users if uid in self.sent]
        for uid in subscribed:
            del self.sent[uid]
        await self.hub.unwatch(self, subscribed)

    async def set_status(self, change: domain.StatusChange) -> None:
        presence = await _apply_change(self.user, change)
        await self.send_json({"type": "status", "presence": presence.as_dict()})

    # --- sending ------------------------------------------------------------------------------

    async def send_json(self, content: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(content, separators=(",", ":")))

    async def send_presences(self, kind: str, presences: dict[int, domain.Presence]) -> None:
        await self.send_json(
            {"type": kind, "presences": {str(uid): p.as_dict() for uid, p in presences.items()}}
        )

    async def send_error(self, code: str, message: str, **extra: Any) -> None:
        await self.send_json({"type": "error", "code": code, "message": message, **extra})


async def _apply_change(user: Any, change: domain.StatusChange) -> domain.Presence:
    from asgiref.sync import sync_to_async

    return await sync_to_async(api.apply_change)(user, change)
