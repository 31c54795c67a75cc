"""The closes of users' last connections, heard by every process that records page views.

A user who closes their last socket and keeps browsing pages without presence.js must be
online again at once: the request after the close is written whatever TOUCH_INTERVAL. The
middleware's throttle is per process, and the close is recorded in Redis by whichever process
held the socket, so the throttle has to learn of it. Reading Redis on every throttled request
would cost each page view a round trip; instead the close script publishes ``user:second`` on
the site's closes channel (lua/connection.lua) and one thread per process listens, so a
throttled request still costs no Redis command.

What the listener misses while it is not subscribed cannot be trusted away: every subscription
starts a new *epoch*, the throttle keeps the epoch each entry was written in, and an entry of
another epoch is not trusted (that user's next request writes). While no subscription stands
(Redis down, pub/sub refused) the throttle keeps its entries as before, TOUCH_INTERVAL long.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from presence.conf import get_settings
from presence.store import PresenceStore, get_store, is_current
from presence.users import UserId, decode_id

logger = logging.getLogger("presence")

#: called on the listener's thread with the user whose last connection went and its second
OnClose = Callable[[UserId, int], None]
#: told each new epoch (a subscription's number; 0 when none stands)
OnEpoch = Callable[[int], None]

_epochs = itertools.count(1)


def parse(message: Any) -> tuple[UserId, int] | None:
    """A closes message's (user, second), or None for anything else."""
    data = message.get("data") if isinstance(message, dict) else None
    if message is None or message.get("type") != "message" or data is None:
        return None
    text = data.decode() if isinstance(data, bytes) else str(data)
    user, _, second = text.rpartition(":")
    try:
        return decode_id(user), int(second)
    except ValueError:
        return None


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class CloseListener:
    """One daemon thread per process (started by the first page view recorded, again after a
    fork or when the store is rebuilt) subscribed to the closes channel."""

    def __init__(self, on_close: OnClose, on_epoch: OnEpoch) -> None:
        self.on_close = on_close
        self.on_epoch = on_epoch
        self._store: PresenceStore | None = None
        #: the first start's wait is over
        self._started = False
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        # A forked child has no thread of its parent's: the next page view starts its own.
        self._store = None
        self.on_epoch(0)

    def ensure(self) -> None:
        """Listening for the current store. Cheap once started. The first start in a thread
        without an event loop waits (bounded) for the subscription, so that the entries written
        next are trusted."""
        store = get_store()
        if self._store is store and self._started:
            return
        with self._lock:
            if self._store is not store:
                self._stop.set()  # the previous store's thread ends by itself
                self._stop, self._subscribed = threading.Event(), threading.Event()
                self._started = False
                self.on_epoch(0)
                self._store = store
                threading.Thread(
                    target=self._run,
                    args=(store, self._stop, self._subscribed),
                    name="presence-closes",
                    daemon=True,
                ).start()
            subscribed = self._subscribed
        if _in_event_loop():
            return  # never blocks a loop; entries written before the subscription write again
        # Every thread of the first requests waits, once: later ones never do, even if Redis
        # was down meanwhile.
        subscribed.wait(get_settings().SOCKET_TIMEOUT * 2)
        self._started = True

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            self._store = None
            self.on_epoch(0)

    def _current(self, store: PresenceStore, stop: threading.Event) -> bool:
        # A store rebuilt (settings changed) or closed is not listened for any longer.
        return not stop.is_set() and self._store is store and is_current(store)

    def _run(
        self, store: PresenceStore, stop: threading.Event, subscribed: threading.Event
    ) -> None:
        failed = False
        while self._current(store, stop):
            if store.known_down():
                # Left alone like every other use of Redis until RETRY_INTERVAL passes.
                stop.wait(min(store.conf.RETRY_INTERVAL, 1.0))
                continue
            pubsub = None
            again_at_once = False
            try:
                pubsub = store.client.pubsub()
                pubsub.subscribe(store.keys.closes_channel())
                self._listen(store, stop, subscribed, pubsub)
                failed = False
            except Exception as error:  # Redis went away, or pub/sub is refused
                # A standing subscription whose connection Redis closed (a restart, a proxy's
                # idle cut) subscribes again at once, as redis-py's own retry did: the store's
                # clients retry nothing (a command may have run), and subscribing twice is
                # harmless. Anything else (Redis away, pub/sub refused) waits RETRY_INTERVAL.
                again_at_once = (
                    isinstance(error, RedisConnectionError) and subscribed.is_set() and not failed
                )
                if not again_at_once and not failed and self._current(store, stop):
                    logger.warning(
                        "Presence: not listening for closed connections (%s); page views are "
                        "throttled without them until it is back",
                        type(error).__name__,
                    )
                failed = not again_at_once
            finally:
                if self._store is store:
                    self.on_epoch(0)
                subscribed.clear()
                if pubsub is not None:
                    pubsub.close()
            if not again_at_once:
                stop.wait(store.conf.RETRY_INTERVAL)

    def _listen(
        self, store: PresenceStore, stop: threading.Event, subscribed: threading.Event, pubsub: Any
    ) -> None:
        while self._current(store, stop):
            message = pubsub.get_message(timeout=1.0)
            if message is None:
                continue
            if message.get("type") == "subscribe":
                if self._store is store:
                    self.on_epoch(next(_epochs))
                subscribed.set()
                continue
            closed = parse(message)
            if closed is not None:
                try:
                    self.on_close(*closed)
                except Exception:
                    logger.exception("Presence: could not handle the close of user %s", closed[0])
