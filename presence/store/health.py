"""Outage tracking: an outage is logged once, and Redis is left alone for RETRY_INTERVAL.
And a pooled connection's own health: one Redis closed is found before a command is sent on it.

The wait is kept in wall-clock time (tests move it with time_machine), read so that a clock
stepped back (NTP) cannot stretch it (domain.passed)."""

from __future__ import annotations

import logging
import select
import threading
import time
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeoutError

from presence import metrics
from presence.domain import passed
from presence.store.redact import redact_url

logger = logging.getLogger("presence")


def is_slow_reply(error: BaseException) -> bool:
    """Whether ``error`` says only that a reply was late (the connection was made and the
    command sent): slowness, not an outage. redis-py raises TimeoutError for a connection that
    could not be made as well ("Timeout connecting ..."), which is an outage."""
    return isinstance(error, RedisTimeoutError) and "Timeout reading" in str(error)


#: select.poll where there is one (any descriptor number, unlike select.select's below 1024)
_poll = getattr(select, "poll", None)


def closed_by_peer(connection: Any) -> bool:
    """Whether an idle asyncio connection must not carry a command: its socket has something
    to read though nothing was asked (Redis closed it: end of file, or a reset; or stray bytes).
    One poll of the socket, no round trip: the event loop learns of a close only at its next
    turn, and a command sent before that would go out on the closed connection, its fate
    unknown (presence.store.connecting.no_retry)."""
    writer = connection._writer
    if writer is None:
        return False  # not connected: it connects before sending
    sock = writer.get_extra_info("socket")
    if sock is None:
        return False
    fd = sock.fileno()
    if fd < 0:
        return True  # the transport closed it already
    if _poll is None:  # pragma: no cover - Windows
        readable, _, failed = select.select([fd], [], [fd], 0)
        return bool(readable or failed)
    poller = _poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))  # (a hang-up or an error is always reported)


async def drop_if_closed(connection: Any) -> None:
    """``connection`` (an idle asyncio one) disconnected if :func:`closed_by_peer`: it
    connects again when next used, before anything is sent."""
    if closed_by_peer(connection):
        await connection.disconnect()


class Health:
    """Tracks an outage so it is logged once and Redis is not hammered while down."""

    def __init__(self, name: str = "Redis", node: str = "redis") -> None:
        #: what is down, in the log ("Redis", or a cluster node)
        self.name = name
        #: the node in metrics: "redis", or a cluster master's host:port
        self.node = node
        metrics.redis_answered(node)
        #: when Redis last failed (time.time()), and the RETRY_INTERVAL it is left alone for
        self.failed_at = 0.0
        self.retry_interval = 0.0
        self.in_outage = False
        #: outages that ended so far (the hub resolves its users again after one)
        self.recoveries = 0
        self._lock = threading.Lock()

    def available(self) -> bool:
        return passed(time.time(), self.failed_at, self.retry_interval)

    def failed(self, error: Exception, retry_interval: float) -> None:
        with self._lock:
            self.failed_at, self.retry_interval = time.time(), retry_interval
            if not self.in_outage:
                self.in_outage = True
                metrics.redis_outage(self.node)
                logger.warning(
                    "Presence: %s is unavailable (%s). Pages keep working; presence is not "
                    "recorded until it answers again (retrying every %ss).",
                    self.name,
                    redact_url(str(error)),  # an error may quote the URL it was given
                    retry_interval,
                )

    def succeeded(self) -> None:
        if self.in_outage:
            with self._lock:
                if self.in_outage:
                    self.in_outage = False
                    self.retry_interval = 0.0
                    self.recoveries += 1
                    metrics.redis_answered(self.node)
                    logger.warning("Presence: %s is reachable again; recording resumed.", self.name)
