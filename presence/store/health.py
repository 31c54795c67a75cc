"""Outage tracking: an outage is logged once, and Redis is left alone for RETRY_INTERVAL.

The wait is kept in wall-clock time (tests move it with time_machine), read so that a clock
stepped back (NTP) cannot stretch it: a wait longer than the interval it was given is over."""

from __future__ import annotations

import logging
import threading
import time

from redis.exceptions import TimeoutError as RedisTimeoutError

from presence import metrics
from presence.store.redact import redact_url

logger = logging.getLogger("presence")


def is_slow_reply(error: BaseException) -> bool:
    """Whether ``error`` says only that a reply was late (the connection was made and the
    command sent): slowness, not an outage. redis-py raises TimeoutError for a connection that
    could not be made as well ("Timeout connecting ..."), which is an outage."""
    return isinstance(error, RedisTimeoutError) and "Timeout reading" in str(error)


class Health:
    """Tracks an outage so it is logged once and Redis is not hammered while down."""

    def __init__(self, name: str = "Redis", node: str = "redis") -> None:
        #: what is down, in the log ("Redis", or a cluster node)
        self.name = name
        #: the node in metrics: "redis", or a cluster master's host:port
        self.node = node
        metrics.redis_answered(node)
        self.down_until = 0.0
        #: the RETRY_INTERVAL of the last failure (what the wait can be at most)
        self.retry_interval = 0.0
        self.in_outage = False
        #: outages that ended so far (the hub resolves its users again after one)
        self.recoveries = 0
        self._lock = threading.Lock()

    def available(self) -> bool:
        wait = self.down_until - time.time()
        # More than the interval left: the clock was stepped back since the failure, which
        # would keep Redis unused for the step's length too. Tried again now.
        return wait <= 0 or wait > self.retry_interval

    def failed(self, error: Exception, retry_interval: float) -> None:
        with self._lock:
            self.down_until = time.time() + retry_interval
            self.retry_interval = retry_interval
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
                    self.down_until = 0.0
                    self.recoveries += 1
                    metrics.redis_answered(self.node)
                    logger.warning("Presence: %s is reachable again; recording resumed.", self.name)
