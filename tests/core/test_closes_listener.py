"""presence.closes.CloseListener against a real Redis: its subscription, closed by Redis (a
restart, a proxy's idle cut: here CLIENT KILL), is taken again at once and without a warning
(the store's clients retry no command, so redis-py no longer re-subscribes by itself)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from presence.closes import CloseListener

pytestmark = pytest.mark.django_db

#: long, so that a subscription taken again within WAIT cannot be the RETRY_INTERVAL's
RETRY_INTERVAL = 60
#: bounds each wait for what must come (ends as soon as it does)
WAIT = 10


class Epochs:
    """The epochs the listener reports, with an event per new one."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.changed = threading.Condition()

    def note(self, epoch: int) -> None:
        with self.changed:
            self.seen.append(epoch)
            self.changed.notify_all()

    def wait_for(self, test: Any) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: test(self.seen), timeout=WAIT)


@pytest.fixture
def listening(settings: Any) -> Iterator[tuple[CloseListener, Epochs]]:
    settings.PRESENCE = {**settings.PRESENCE, "RETRY_INTERVAL": RETRY_INTERVAL}
    epochs = Epochs()
    listener = CloseListener(on_close=lambda user, second: None, on_epoch=epochs.note)
    listener.ensure()
    try:
        yield listener, epochs
    finally:
        listener.stop()


def test_a_subscription_redis_closed_is_taken_again_at_once(
    listening: tuple[CloseListener, Epochs], redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    _listener, epochs = listening
    assert epochs.wait_for(lambda seen: any(seen))
    first = max(epochs.seen)
    caplog.set_level(logging.WARNING, logger="presence")

    killed = redis.Redis.from_url(redis_url).client_kill_filter(_type="pubsub")
    assert killed >= 1

    # Lost (epoch 0: closes may be missed meanwhile), then a new subscription long before
    # RETRY_INTERVAL.
    assert epochs.wait_for(lambda seen: seen[-1] > first and 0 in seen[seen.index(first) :])
    assert not [r for r in caplog.records if "not listening" in r.getMessage()]
