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
from presence.api import anote_guest, note_guest
from presence.closes import CloseListener
from presence.conf import get_settings
from presence.domain import UserId, device_from_user_agent, passed
from presence.stamps import note_read

logger = logging.getLogger("presence")


class _Entry:
    """A user's write in this process: when, in which epoch of the closes listener, their
    latest request since (throttled), and the device kind written."""

    __slots__ = ("device", "epoch", "requested", "written")

    def __init__(self, written: float, epoch: int, device: str) -> None:
        self.written = written
        self.epoch = epoch
        self.requested = written
        self.device = device


class TouchThrottle:
    """Remembers, per process, when each user was last written, to write at most once per
    ``TOUCH_INTERVAL``. Bounded: past ``MAX_ENTRIES`` it forgets entries older than the interval,
    and everything if that is not enough (forgetting costs at most one extra write a user).

    A user's last connection closing ends the interval (:meth:`closed`, from
    :mod:`presence.closes`): the request after a close is written at once. An entry written in
    another epoch of the closes listener than the current one is not trusted (a close may have
    been missed meanwhile)."""

    MAX_ENTRIES = 100_000

    def __init__(self) -> None:
        self._last: dict[UserId, _Entry] = {}
        self._lock = threading.Lock()
        #: the closes listener's current epoch (presence.closes); 0 while it is not subscribed
        self.epoch = 0

    def due(self, user_id: UserId, now: float, interval: float) -> bool:
        entry = self._last.get(user_id)
        if entry is None or entry.epoch != self.epoch:
            return True
        # (a clock that went backwards must not stop recording: domain.passed)
        return passed(now, entry.written, interval)

    def claim(self, user_id: UserId, now: float, interval: float) -> bool:
        """Whether to write ``user_id`` now; if so, remembers it. Atomic, so concurrent
        requests of one user in one process write once."""
        with self._lock:
            if not self.due(user_id, now, interval):
                self._last[user_id].requested = now
                return False
            self._remember(user_id, now, interval, "web")
            return True

    def note_device(self, user_id: UserId, device: str) -> None:
        """The device kind of the write just claimed (written again if a close calls for it)."""
        entry = self._last.get(user_id)
        if entry is not None:
            entry.device = device

    def mark(self, user_id: UserId, now: float | None = None, device: str = "web") -> None:
        now = time.time() if now is None else now
        with self._lock:
            self._remember(user_id, now, get_settings().TOUCH_INTERVAL, device)

    def closed(self, user_id: UserId, second: int) -> str | None:
        """The user's last connection went in ``second``. Their entry stops throttling; if a
        request was throttled after that second, the device kind to write now (the entry is
        renewed), else None. A request within the close's own second is taken as before it:
        the page's own requests just before its tab closed must not keep the user online for
        ONLINE_WINDOW (their next request is written at once anyway)."""
        with self._lock:
            entry = self._last.get(user_id)
            if entry is None or entry.written >= second + 1:
                return None  # nothing throttled here, or written after the close
            if entry.requested > entry.written and entry.requested >= second + 1:
                entry.written = entry.requested = time.time()
                return entry.device
            del self._last[user_id]
            return None

    def _remember(self, user_id: UserId, now: float, interval: float, device: str) -> None:
        if len(self._last) >= self.MAX_ENTRIES and user_id not in self._last:
            self._last = {k: v for k, v in self._last.items() if 0 <= now - v.written < interval}
            if len(self._last) >= self.MAX_ENTRIES:
                # Everyone is recent: pruning again on every request would cost O(n) each.
                self._last.clear()
        self._last[user_id] = _Entry(now, self.epoch, device)

    def forget(self, user_id: UserId) -> None:
        with self._lock:
            self._last.pop(user_id, None)

    def clear(self) -> None:
        with self._lock:
            self._last.clear()

    def __len__(self) -> int:
        return len(self._last)


throttle = TouchThrottle()


def _on_close(user_id: UserId, second: int) -> None:
    # On the listener's thread: a request this process throttled came after the close.
    device = throttle.closed(user_id, second)
    if device is not None:
        try:
            api.touch(user_id, device)
        except Exception:
            logger.exception("Presence: could not record activity")


def _epoch_changed(epoch: int) -> None:
    throttle.epoch = epoch


listener = CloseListener(_on_close, _epoch_changed)


def _claim(request: HttpRequest, user: Any) -> tuple[UserId, str] | None:
    """Whether this request should be recorded: (user id, device), claiming the slot."""
    if user is None or not user.is_authenticated:
        return None
    listener.ensure()
    # Claim before writing so concurrent requests of the same user do not all write.
    if not throttle.claim(user.pk, time.time(), get_settings().TOUCH_INTERVAL):
        return None
    device = device_from_user_agent(request.META.get("HTTP_USER_AGENT")).value
    throttle.note_device(user.pk, device)
    return user.pk, device


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
