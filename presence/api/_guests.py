"""Guests (``COUNT_GUESTS``): how many distinct anonymous visitors made a request within
ONLINE_WINDOW, counted approximately and storing nothing that identifies them.

A visitor is their session key where they have a session, else their address and user agent.
What reaches Redis is a keyed digest of that identity (HMAC with SECRET_KEY, salted with the
UTC day: the same visitor gives another digest tomorrow, and nobody without the secret key can
compute one), added to a HyperLogLog (presence.store.plans.guests), which keeps no element at
all. The middleware calls :func:`note_guest` / :func:`anote_guest`; a page never waits on more
than one round trip for it, and never breaks for it.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

from django.utils.crypto import salted_hmac

from presence import resolution
from presence.api._counting import fresh_reading, keep_reading
from presence.conf import get_settings
from presence.operations import Operation, arun, redis, run
from presence.store import PresenceStore, get_store

logger = logging.getLogger("presence")


def _guest_count() -> Operation[int]:
    if not get_settings().COUNT_GUESTS:
        return 0
    counted = fresh_reading("guests")
    if counted is None:
        store = get_store()
        counted = keep_reading(
            "guests", (yield from redis(store.plans.count_guests(resolution.now())))
        )
    return counted


def guest_count() -> int:
    """Distinct anonymous visitors who made a request within ONLINE_WINDOW (to a tenth of it),
    approximately (HyperLogLog: a standard error of 0.81%). 0 unless ``COUNT_GUESTS``, and
    while Redis is unavailable. One PFCOUNT merging the window's buckets (a few hundred
    microseconds of Redis for large counts), read at most once per COUNT_INTERVAL (5 s) per
    process: every page may show it."""
    return run(_guest_count())


async def aguest_count() -> int:
    return await arun(_guest_count())


def visitor_digest(request: Any, now: float) -> str:
    """The opaque element a visitor is counted as today: 16 hex digits of an HMAC (keyed with
    SECRET_KEY, salted with the UTC day) of their session key, else of their address and user
    agent. Not reversible, and another one tomorrow."""
    session = getattr(request, "session", None)
    session_key = getattr(session, "session_key", None)
    if session_key:
        identity = f"s|{session_key}"
    else:
        meta = request.META
        identity = f"a|{meta.get('REMOTE_ADDR', '')}|{meta.get('HTTP_USER_AGENT', '')}"
    day = datetime.fromtimestamp(now, UTC).date().isoformat()
    return salted_hmac(f"presence.guests.{day}", identity, algorithm="sha256").hexdigest()[:16]


class _Noted:
    """The visitors this process added to the current guest bucket: adding one again to the
    same HyperLogLog changes nothing, so each is written once per bucket per process (the
    guests' throttle, losing nothing). Bounded: past MAX_ENTRIES it starts over."""

    MAX_ENTRIES = 100_000

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bucket: tuple[PresenceStore, int] | None = None
        self._digests: set[str] = set()

    def claim(self, store: PresenceStore, bucket: int, digest: str) -> bool:
        with self._lock:
            if self._bucket != (store, bucket) or len(self._digests) >= self.MAX_ENTRIES:
                self._bucket, self._digests = (store, bucket), set()
            if digest in self._digests:
                return False
            self._digests.add(digest)
            return True

    def forget(self, digest: str) -> None:
        with self._lock:
            self._digests.discard(digest)


noted = _Noted()


def _note(request: Any, user: Any) -> Operation[None]:
    if not get_settings().COUNT_GUESTS or user is None or user.is_authenticated:
        return
    store = get_store()
    now = resolution.now()
    digest = visitor_digest(request, now)
    if not noted.claim(store, store.plans.guest_bucket(now), digest):
        return
    written = yield from redis(store.plans.note_guest(digest, now))
    if written is None:
        noted.forget(digest)  # not recorded (Redis unavailable): the next request tries again


def note_guest(request: Any, user: Any) -> None:
    """Count the request's visitor as a guest if ``user`` is anonymous and COUNT_GUESTS is on
    (the middleware's; never raises: a page must not break for a count)."""
    try:
        run(_note(request, user))
    except Exception:  # the store already fails open; this guards anything else
        logger.exception("Presence: could not count a guest")


async def anote_guest(request: Any, user: Any) -> None:
    try:
        await arun(_note(request, user))
    except Exception:
        logger.exception("Presence: could not count a guest")
