"""What the handshake's ASGI scope says of a new connection: the page that opened it, the
device it runs on and whether its client is idle."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from django.utils.translation import gettext

from presence import domain
from presence.origins import ORIGIN_CHECKED, foreign_origin


def opened_from_foreign_origin(scope: dict[str, Any]) -> bool:
    """Whether a browser page of another site opened this socket, as the ASGI wiring's
    PresenceOriginValidator decides (presence.origins), in case a site forgot it or wired
    channels' validator. No Origin header: not a browser, so no cross-site risk. Not checked
    twice where PresenceOriginValidator let it through (a page view's socket parsed its Origin
    and read ALLOWED_HOSTS twice)."""
    return not scope.get(ORIGIN_CHECKED) and foreign_origin(scope)


def opening_query(scope: dict[str, Any]) -> dict[str, list[str]]:
    """The handshake's query string, parsed once for :func:`device_of` and :func:`idle_of`."""
    return parse_qs(scope.get("query_string", b"").decode("latin-1"))


def device_of(
    scope: dict[str, Any], query: dict[str, list[str]]
) -> tuple[domain.Device, str | None]:
    """The device kind from ``?device=`` (``query``: :func:`opening_query`), else guessed from
    the User-Agent; and an error for an unknown kind (the guess is used then)."""
    headers = dict(scope.get("headers") or [])
    guess = domain.device_from_user_agent(headers.get(b"user-agent", b"").decode("latin-1") or None)
    asked = query.get("device", [None])[0]
    if asked is None:
        return guess, None
    try:
        return domain.Device(asked), None
    except ValueError:
        return guess, gettext(
            "Unknown device %(device)s: use web, mobile or desktop; using %(guess)s."
        ) % {"device": repr(asked[:20]), "guess": guess.value}


def idle_of(query: dict[str, list[str]]) -> tuple[bool, str | None]:
    """Whether the client opened idle (``?state=idle``; ``active`` or none: active; ``query``:
    :func:`opening_query`), as its heartbeats say it: a hidden tab that reconnects stays idle
    instead of showing its user online to every watcher and idle again at its next heartbeat.
    And an error for an unknown state (active is used then)."""
    asked = query.get("state", [None])[0]
    if asked is None:
        return False, None
    try:
        return domain.HeartbeatState(asked) is domain.HeartbeatState.IDLE, None
    except ValueError:
        return False, gettext("Unknown state %(state)s: use 'active' or 'idle'.") % {
            "state": repr(asked[:20])
        }
