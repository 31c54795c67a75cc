"""Is the session a WebSocket was opened with still valid? (logout, password change)

A socket authenticates once, at its handshake; these checks let it end with its session. Session
keys never leave this module in the clear: the live layer sends digests of them, and nothing
here logs one.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,
    load_backend,
)
from django.utils.crypto import constant_time_compare, salted_hmac


def session_key_of(scope: dict[str, Any]) -> str | None:
    """The key of the session a connection's scope carries (channels' SessionMiddleware), if any."""
    session = scope.get("session")
    if session is None:
        return None
    key = getattr(session, "session_key", None)
    return str(key) if key else None


def session_digest(session_key: str) -> str:
    """A keyed digest that names a session in channel-layer messages without revealing it."""
    return salted_hmac("presence.sessions", session_key, algorithm="sha256").hexdigest()


def session_is_valid(session_key: str, user_id: Any) -> bool:
    """Whether the session still exists, still logs in ``user_id`` (an active user, through a
    configured backend) and carries the user's current auth hash, as Django checks on every
    request. Read-only: unlike ``django.contrib.auth.get_user`` it neither flushes nor cycles
    the session, which the browser still uses."""
    engine = import_module(settings.SESSION_ENGINE)
    session = engine.SessionStore(session_key)
    try:
        stored_id = get_user_model()._meta.pk.to_python(session[SESSION_KEY])
        backend_path = session[BACKEND_SESSION_KEY]
    except (KeyError, ValueError, TypeError):
        return False
    if backend_path not in settings.AUTHENTICATION_BACKENDS:
        return False
    user = load_backend(backend_path).get_user(stored_id)
    if user is None or user.pk != user_id:
        return False
    if not hasattr(user, "get_session_auth_hash"):
        return True
    stored_hash = session.get(HASH_SESSION_KEY)
    if not stored_hash:
        return False
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    return any(constant_time_compare(stored_hash, current) for current in hashes)
