"""WebSocket routes and the ASGI wiring in front of them: include the routes in the site's ASGI
application behind
``PresenceOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))``.

Channels' ``AllowedHostsOriginValidator`` works in its place for browsers, but refuses clients
that send no ``Origin`` (native and mobile apps) at the handshake.
"""

from __future__ import annotations

from typing import Any

from django.urls import path

from presence.consumers import PresenceConsumer
from presence.origins import ORIGIN_CHECKED, foreign_origin

websocket_urlpatterns = [
    path("ws/presence/", PresenceConsumer.as_asgi(), name="presence-socket"),
]


class PresenceOriginValidator:
    """ASGI middleware for the WebSocket: refuses (403, at the handshake) a connection opened by
    another site's page, as channels' ``AllowedHostsOriginValidator`` does (an ``Origin`` outside
    ``ALLOWED_HOSTS``; with ``DEBUG`` and no ``ALLOWED_HOSTS``, localhost only), and
    ``Origin: null``; serves a client that sends no ``Origin`` (not a browser: a native app).
    ``ALLOWED_HOSTS`` is read as each client connects. Rules: :mod:`presence.origins`."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("PresenceOriginValidator guards WebSocket connections only.")
        if foreign_origin(scope):
            return await refuse_handshake(receive, send)
        return await self.application({**scope, ORIGIN_CHECKED: True}, receive, send)


async def refuse_handshake(receive: Any, send: Any) -> None:
    """Refuse a WebSocket at its handshake (the server answers 403) and end at once. Not
    channels' ``WebsocketDenier``: a consumer, it takes a channel-layer channel and listens on
    it until a disconnect the refused client never sends (with a Redis layer, a receive that
    later logs a timeout as an error: any page could fill the logs)."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close"})
