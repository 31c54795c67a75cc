"""Tokens for native and mobile clients, which have no session cookie.

A site issues a token to a logged-in user (``issue_token(user)``, e.g. from its own login API)
and the app sends it as ``Authorization: Bearer <token>``:

- on the WebSocket handshake: :class:`TokenAuthMiddleware` (ASGI) sets ``scope["user"]``;
- on the JSON endpoints: :class:`TokenAuthenticationMiddleware` (Django) sets ``request.user``.

A token is signed with the site's ``SECRET_KEY`` (``django.core.signing``), names the user and
carries a hash of their password hash: it expires after ``TOKEN_MAX_AGE`` seconds and as soon as
the user changes their password or is deactivated. A missing or bad token leaves the user
anonymous, so the socket is closed with 4401 and the endpoints answer 401. Tokens are never
logged; send them in the header, not in the URL (servers log URLs).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest, HttpResponseBase

# The token's mechanics live with the other credential checks (an open socket re-checks its
# token as it re-checks a session); this module is their public face.
from presence.sessions import SCOPE_TOKEN, issue_token, user_for_token

__all__ = [
    "TokenAuthMiddleware",
    "TokenAuthenticationMiddleware",
    "bearer_token",
    "issue_token",
    "user_for_token",
]


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class TokenAuthMiddleware:
    """ASGI middleware for the WebSocket: a connection with ``Authorization: Bearer <token>``
    and no authenticated user yet gets the token's user as ``scope["user"]`` (else anonymous).

    Put it inside ``AuthMiddlewareStack`` (sessions first, tokens for the others)::

        AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))
    """

    def __init__(self, inner: Callable[..., Awaitable[None]]) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        user = scope.get("user")
        if user is None or not getattr(user, "is_authenticated", False):
            headers = dict(scope.get("headers") or [])
            token = bearer_token(headers.get(b"authorization", b"").decode("latin-1"))
            if token is not None:
                found = await sync_to_async(user_for_token)(token)
                scope = {**scope, "user": found or AnonymousUser()}
                if found is not None:
                    # The consumer re-checks it (password change, deactivation, expiry).
                    scope[SCOPE_TOKEN] = token
        await self.inner(scope, receive, send)


class TokenAuthenticationMiddleware:
    """Django middleware for the JSON endpoints: a request with ``Authorization: Bearer
    <token>`` and no session user is the token's user. Such a request carries no cookie, so
    presence's endpoints skip their CSRF check for it. Put it after AuthenticationMiddleware."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self.__acall__(request)
        self._authenticate(request, user_for_token)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        # request.user is loaded lazily from the session (the database), which an event loop
        # may not touch: await AuthenticationMiddleware's request.auser() instead.
        auser = getattr(request, "auser", None)
        user = await auser() if auser is not None else getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            token = bearer_token(request.META.get("HTTP_AUTHORIZATION"))
            if token is not None:
                found = await sync_to_async(user_for_token)(token)
                if found is not None:
                    self._accept(request, found)
        response: HttpResponseBase = await self.get_response(request)
        return response

    @staticmethod
    def _token(request: HttpRequest) -> str | None:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return None
        return bearer_token(request.META.get("HTTP_AUTHORIZATION"))

    def _authenticate(self, request: HttpRequest, lookup: Callable[[str], Any]) -> None:
        token = self._token(request)
        if token is None:
            return
        found = lookup(token)
        if found is not None:
            self._accept(request, found)

    @staticmethod
    def _accept(request: HttpRequest, found: Any) -> None:
        request.user = found

        # Async views read the user with `await request.auser()`: it must say the same.
        async def auser() -> Any:
            return found

        request.auser = auser
        #: authenticated by a header, not by a cookie: no cross-site request can carry it
        request.presence_token_auth = True  # type: ignore[attr-defined]
