"""ASGI entry point of the demo: Django for HTTP, Channels for WebSockets.

daphne siteproject.asgi:application
"""

from __future__ import annotations

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "siteproject.settings")

# Load Django (apps, models) before importing anything that touches models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from presence.collector import collect_in_short_pauses  # noqa: E402
from presence.routing import PresenceOriginValidator, websocket_urlpatterns  # noqa: E402
from presence.tokens import TokenAuthMiddleware  # noqa: E402

# daphne started directly (as `make demo` does) does not serve static files; do it in DEBUG.
http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app

# Everything loaded so far lives as long as the process: out of the collector's sight, a full
# collection no longer walks it, which stalled the event loop (docs/deployment.md). So is, from
# each full collection to the next, what survived it: only once in five minutes does one walk
# the sockets' long-lived objects.
gc.freeze()
collect_in_short_pauses()

application = ProtocolTypeRouter(
    {
        "http": http_app,
        # Refuses other sites' pages (Origin outside ALLOWED_HOSTS), serves native apps (no Origin,
        # authenticated by a session cookie or by a token: docs/websocket.md).
        "websocket": PresenceOriginValidator(
            AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))
        ),
    }
)
