"""The ASGI application of the page-view benchmark's server process (daphne, on
``benchmarks.settings`` with the benchmark's database): presence's WebSocket wired as the demo
site wires it (``siteproject.asgi``), and beside it, at ``ws/bare/``, Channels' own minimum: a
consumer behind ``AuthMiddlewareStack`` that accepts, reads ``scope["user"]``, answers one frame
and closes (``ws/bare/?hold=1``: stays open until the client closes, the load test's killed
floor of a reconnect storm, ``tools/loadtest/storm.py``).

``BENCH_PROFILE=PATH`` runs the event loop's thread under cProfile; SIGUSR1 writes the profile
to PATH (and starts a fresh one), so that the benchmark can profile one phase.
"""

from __future__ import annotations

import gc
import os
from typing import Any
from urllib.parse import parse_qs

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.page_views_settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from presence.routing import PresenceOriginValidator, websocket_urlpatterns  # noqa: E402
from presence.tokens import TokenAuthMiddleware  # noqa: E402


class BareConsumer(AsyncWebsocketConsumer):
    """What any authenticated Channels socket costs: accept, read the user, one frame, close;
    with ``?hold=1`` the socket stays open until the client closes it (or the process dies)."""

    async def connect(self) -> None:
        await self.accept()
        user = self.scope["user"]
        pk = user.pk if user.is_authenticated else None
        await self.send(text_data=f'{{"type":"hello","user":{"null" if pk is None else pk}}}')
        if parse_qs(self.scope["query_string"].decode()).get("hold") != ["1"]:
            await self.close()


bare_urlpatterns = [path("ws/bare/", BareConsumer.as_asgi())]

# Ours exactly as a site deploys it (docs/websocket.md); the bare one behind Channels' own stack.
ours = PresenceOriginValidator(
    AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))
)
bare = AuthMiddlewareStack(URLRouter(bare_urlpatterns))


async def websocket(scope: dict[str, Any], receive: Any, send: Any) -> None:
    app = bare if scope["path"].startswith("/ws/bare/") else ours
    await app(scope, receive, send)


gc.freeze()

application = ProtocolTypeRouter({"http": django_asgi_app, "websocket": websocket})

if os.environ.get("BENCH_PROFILE"):
    import cProfile
    import signal
    import time

    # CPU time of the event loop's thread, not wall time: on a machine shared with other work a
    # wall-clock profile charges a function with the time the thread waited for a CPU (most of
    # all the system calls that wake another process: a socket's send to Redis).
    _profile = cProfile.Profile(time.thread_time)
    _profile.enable()

    def _dump(signum: int, frame: object) -> None:
        global _profile
        _profile.disable()
        _profile.dump_stats(os.environ["BENCH_PROFILE"])
        _profile = cProfile.Profile(time.thread_time)
        _profile.enable()

    signal.signal(signal.SIGUSR1, _dump)
