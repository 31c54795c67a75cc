"""Records each authenticated request's activity, throttled, never breaking a page."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from presence import api
from presence.api._guests import anote_guest, note_guest
from presence.conf import get_settings
from presence.domain import UserId, device_from_user_agent
from presence.stamps import note_read

logger = logging.getLogger("presence")


class TouchThrottle:
    """Remembers, per process, when each user was last written, to write at most once per
    ``TOUCH_INTERVAL``. Bounded: past ``MAX_ENTRIES`` it forgets entries older than the interval,
    and everything if that is not enough (forgetting costs at most one extra write a user)."""

    MAX_ENTRIES = 100_000

    def __init__(self) -> None:
        self._last: dict[UserId, float] = {}
        self._lock = threading.Lock()

    def due(self, user_id: UserId, now: float, interval: float) -> bool:
        last = self._last.get(user_id)
        # A clock that went backwards (now < last) must not stop recording.
        return last is None or now - last >= interval or now < last

    def claim(self, user_id: UserId, now: float, interval: float) -> bool:
        """Whether to write ``user_id`` now; if so, remembers it. Atomic, so concurrent
        requests of one user in one process write once."""
        with self._lock:
            if not self.due(user_id, now, interval):
                return False
            self._remember(user_id, now, interval)
            return True

    def mark(self, user_id: UserId, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            self._remember(user_id, now, get_settings().TOUCH_INTERVAL)

    def _remember(self, user_id: UserId, now: float, interval: float) -> None:
        if len(self._last) >= self.MAX_ENTRIES and user_id not in self._last:
            self._last = {k: v for k, v in self._last.items() if 0 <= now - v < interval}
            if len(self._last) >= self.MAX_ENTRIES:
                # Everyone is recent: pruning again on every request would cost O(n) each.
                self._last.clear()
        self._last[user_id] = now

    def forget(self, user_id: UserId) -> None:
        with self._lock:
            self._last.pop(user_id, None)

    def clear(self) -> None:
        with self._lock:
            self._last.clear()

    def __len__(self) -> int:
        return len(self._last)


throttle = TouchThrottle()


def _claim(request: HttpRequest, user: Any) -> tuple[UserId, str] | None:
    """Whether this request should be recorded: (user id, device), claiming the slot."""
    if user is None or not user.is_authenticated:
        return None
    # Claim before writing so concurrent requests of the same user do not all write.
    if not throttle.claim(user.pk, time.time(), get_settings().TOUCH_INTERVAL):
        return None
    device = device_from_user_agent(request.META.get("HTTP_USER_AGENT"))
    return user.pk, device.value


class PresenceMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(
        self,
        get_response: Callable[[HttpRequest], HttpResponseBase]
        | Callable[[HttpRequest], Awaitable[HttpResponseBase]],
    ) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        claim = _claim(request, getattr(request, "user", None))
        if claim is not None:
            try:
                api.touch(*claim)
            except Exception:  # the store already fails open; this guards anything else
                logger.exception("Presence: could not record activity")
        note_guest(request, getattr(request, "user", None))  # COUNT_GUESTS; never raises
        note_read(request)  # the page's stamp: nothing the view reads is older (presence.stamps)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        auser = getattr(request, "auser", None)
        user = await auser() if auser is not None else None
        claim = _claim(request, user)
        if claim is not None:
            try:
                await api.atouch(*claim)
            except Exception:
                logger.exception("Presence: could not record activity")
        await anote_guest(request, user)  # COUNT_GUESTS; never raises
        note_read(request)
        return await self.get_response(request)  # type: ignore[misc]
