"""Which pages may open presence's WebSocket: the one Origin rule of the ASGI wiring
(:class:`presence.routing.PresenceOriginValidator`) and of the consumer's own check.

A browser always sends ``Origin``: a page of a host outside ``ALLOWED_HOSTS`` (with ``DEBUG``
and no ``ALLOWED_HOSTS``: localhost) is another site's, and is refused exactly as channels'
``AllowedHostsOriginValidator`` refuses it; so is ``Origin: null`` (sandboxed iframes, ``file://``
pages: a browser, of no site of ours). A client that sends no ``Origin`` is not a browser (a
native or mobile app, a server), so no other site's page can be behind it: it is served.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from channels.security.websocket import OriginValidator
from django.conf import settings

#: what channels and Django's host check allow in development without ALLOWED_HOSTS
DEBUG_HOSTS = ["localhost", "127.0.0.1", "[::1]"]


def allowed_hosts() -> list[str]:
    """The hosts whose pages may connect, read now (settings may change after start-up)."""
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = list(DEBUG_HOSTS)
    return allowed


#: set in the scope by the ASGI wiring's validator (PresenceOriginValidator) once it found the
#: origin not foreign: the consumer's own check then need not parse it again. A scope key, not a
#: header: no client can set it.
ORIGIN_CHECKED = "presence.origin_checked"


def foreign_origin(scope: dict[str, Any]) -> bool:
    """Whether a browser page of another site opened this connection: its ``Origin`` is outside
    ALLOWED_HOSTS, ``null`` or unreadable. No ``Origin`` at all: not a browser, not foreign."""
    origin = dict(scope.get("headers") or []).get(b"origin")
    if origin is None:
        return False
    try:
        parsed = urlparse(origin.decode("latin-1"))
    except ValueError:  # e.g. an unclosed "[" of an IPv6 host
        return True
    return not OriginValidator(None, allowed_hosts()).valid_origin(parsed)
