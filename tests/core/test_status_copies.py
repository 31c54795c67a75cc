"""Redis's copy of the users' choices follows the database (presence.copies): two changes of
one user that cross between the database and Redis, a Redis that lost the copy (flushed) met by
a write, and ``presence_cleanup`` on such a Redis. The online count leaves invisible users out,
and user_online says what the database says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from presence import api, signals
from presence.models import PrivacySettings
from presence.store import PresenceStore
from tests.conftest import _flush_presence_state

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.uuid_site, pytest.mark.cluster]


@pytest.fixture
def onlines() -> Iterator[list[tuple[Any, bool]]]:
    """(user id, invisible) of each user_online sent in the test."""
    got: list[tuple[Any, bool]] = []

    def record(sender: Any, user_id: Any, invisible: bool, **kwargs: Any) -> None:
        got.append((user_id, invisible))

    signals.user_online.connect(record)
    yield got
    signals.wait_sent()
    signals.user_online.disconnect(record)


def told(got: list[tuple[Any, bool]], user: Any) -> list[bool]:
    signals.wait_sent()
    return [invisible for user_id, invisible in got if user_id == user.pk]


def within(seconds: float, check: Callable[[], bool]) -> bool:
    """Whether ``check()`` holds within ``seconds`` (work of a thread of presence's own)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_two_changes_that_cross_leave_the_databases_last_word(
    make_user: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    onlines: list[tuple[Any, bool]],
) -> None:
    # Device A makes the user visible: its rows are committed, and its write to Redis is held
    # back; meanwhile device B (another thread, or process) makes them invisible, rows and
    # Redis. A's write then reaches Redis last.
    user = make_user()
    held, reached = threading.Event(), threading.Event()
    first_writer: list[threading.Thread] = []
    run = PresenceStore.run

    def held_back(store: PresenceStore, plan: Any) -> Any:
        if threading.current_thread() in first_writer and not held.is_set():
            reached.set()
            held.wait(10)
        return run(store, plan)

    monkeypatch.setattr(PresenceStore, "run", held_back)
    device_a = threading.Thread(target=api.set_status, args=(user, "auto"))
    first_writer.append(device_a)
    device_a.start()
    assert reached.wait(10)
    api.set_status(user, "invisible")
    held.set()
    device_a.join(10)
    assert PrivacySettings.objects.get(user=user).invisible is True
    api.touch(user)
    assert api.online_count() == 0
    assert told(onlines, user) == [True]


def test_a_write_on_a_redis_that_lost_the_choices_tells_the_databases(
    make_user: Callable[..., Any], redis_url: str, onlines: list[tuple[Any, bool]]
) -> None:
    shown, hidden = make_user(), make_user()
    api.set_status(hidden, "invisible")
    _flush_presence_state(redis_url)  # Redis restarted empty
    api.touch(hidden)
    assert api.online_count() == 0
    api.touch(shown)
    # The shard is seeded from the database by then or soon after: the visible user counts,
    # the invisible one never did.
    assert within(10, lambda: api.online_count() == 1)
    assert told(onlines, hidden) == [True]
    assert told(onlines, shown) == [False]


def test_cleanup_seeds_a_redis_that_lost_the_choices(
    make_user: Callable[..., Any], redis_url: str, onlines: list[tuple[Any, bool]]
) -> None:
    user = make_user()
    api.set_status(user, "invisible", text="Away", expires_at=timezone.now() + timedelta(hours=1))
    _flush_presence_state(redis_url)
    report = api.cleanup()
    assert report.shards_seeded >= 1
    api.touch(user)
    assert api.online_count() == 0
    assert told(onlines, user) == [True]
    assert api.cleanup().shards_seeded == 0
