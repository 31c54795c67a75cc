"""WebSocket routes: include them in the site's ASGI application behind
``AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))``."""

from __future__ import annotations

from django.urls import path

from presence.consumers import PresenceConsumer

websocket_urlpatterns = [
    path("ws/presence/", PresenceConsumer.as_asgi(), name="presence-socket"),
]
