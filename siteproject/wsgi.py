"""WSGI entry point (plain HTTP only; the live WebSocket layer needs ASGI, see asgi.py)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "siteproject.settings")

application = get_wsgi_application()
