"""WebSocket routes. The live consumer (``ws/presence/``) arrives with the live presence issue;
the list exists now so sites can wire their ASGI application once."""

from __future__ import annotations

from typing import Any

websocket_urlpatterns: list[Any] = []
