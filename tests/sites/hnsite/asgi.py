# The README's asgi.py, as the site pasted it (its settings module: tests.settings.hn).
# asgi.py -- complete: Django must be set up before anything imports models
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings.hn")
django_asgi_app = get_asgi_application()  # first: sets Django up

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from presence.routing import PresenceOriginValidator, websocket_urlpatterns  # noqa: E402

# In development an ASGI server serves no static files by itself (presence.js!).
http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.DEBUG else django_asgi_app

application = ProtocolTypeRouter(
    {
        "http": http_app,
        # Refuses other sites' pages (Origin outside ALLOWED_HOSTS), serves native apps (no Origin).
        "websocket": PresenceOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
