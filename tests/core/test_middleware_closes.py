"""PresenceMiddleware after a user's last connection closed: the next page is written at once,
whatever TOUCH_INTERVAL (presence.closes), against a real Redis and its pub/sub.

The sockets here are recorded through the store, as the ASGI process that held them would:
the middleware's process learns of the close only from Redis. tests/live/test_browsing.py does
the same with real sockets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path

from presence import api, lifecycle
from presence.conf import get_settings
from presence.domain import Status
from presence.middleware import TouchThrottle, listener, throttle
from presence.models import Contact
from presence.store import get_store
from tests.clock import T0, at
from tests.conftest import RedisCommandCounter
from tests.core.test_middleware import ONE_TOUCH


def ok_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("ok/", ok_view)]

pytestmark = [
    pytest.mark.urls(__name__),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.django_db,
]


@pytest.fixture(autouse=True)
def _listening(_clean_presence_state: None) -> None:
    listener.ensure()  # its connection's handshake is not a page's (see test_middleware.py)


def socket(user: Any, op: str, seconds: float) -> None:
    """A connection of ``user`` opened or closed at T0 + ``seconds`` by another process."""
    store = get_store()
    store.run(store.plans.connection(user.pk, op, T0.timestamp() + seconds, "tab"))  # type: ignore[arg-type]


def throttled(user: Any) -> bool:
    return not throttle.due(user.pk, time.time(), get_settings().TOUCH_INTERVAL)


def heard_close_of(user: Any) -> None:
    """Waits (bounded, real time) for the listener to drop the user's throttle entry."""
    for _ in range(500):
        if not throttled(user):
            return
        time.sleep(0.01)
    raise AssertionError("the close was not heard within 5 s")


def online_to(target: Any, viewer: Any, seconds: float) -> bool:
    seen = api.get_presence(target, viewer)
    return seen.status is Status.ONLINE and seen.last_seen == at(seconds)


@pytest.fixture
def pair(make_user: Callable[..., Any]) -> tuple[Any, Any]:
    target, friend = make_user(), make_user()
    Contact.objects.create(owner=target, contact=friend)
    return target, friend


def test_the_page_after_the_last_close_is_written_at_once(
    pair: tuple[Any, Any], clock: time_machine.Coordinates, redis_commands: RedisCommandCounter
) -> None:
    target, friend = pair
    grace = get_settings().OFFLINE_GRACE
    client = Client()
    client.force_login(target)  # written at T0; its pages are throttled for TOUCH_INTERVAL
    socket(target, "open", 1)
    clock.shift(2)
    assert client.get("/ok/").status_code == 200  # still on a page with presence.js
    assert throttled(target)

    clock.shift(1)
    socket(target, "close", 3)  # to a page without presence.js (another process's socket)
    heard_close_of(target)
    clock.shift(1)  # T0+4: well within TOUCH_INTERVAL of the write at T0
    before = redis_commands.snapshot()
    assert client.get("/ok/").status_code == 200
    assert redis_commands.delta(before) == ONE_TOUCH
    assert online_to(target, friend, 4)

    # Past the close's grace: online still (the page counts for ONLINE_WINDOW).
    clock.shift(grace + 1)
    assert async_to_sync(lifecycle.asweep)().offline == []
    assert online_to(target, friend, 4)
    # ... and the pages after it are throttled again.
    before = redis_commands.snapshot()
    assert client.get("/ok/").status_code == 200
    assert redis_commands.delta(before) == {}


def test_a_page_throttled_before_the_close_was_heard_is_written_when_it_is(
    pair: tuple[Any, Any], clock: time_machine.Coordinates
) -> None:
    # Across processes the close's message may come after a page this process throttled
    # although the page came after the close: the listener writes that page then.
    target, friend = pair
    grace = get_settings().OFFLINE_GRACE
    client = Client()
    client.force_login(target)
    socket(target, "open", 1)
    clock.shift(4)
    assert client.get("/ok/").status_code == 200  # throttled: nothing written
    assert throttled(target)

    socket(target, "close", 3)  # the close, at T0+3, is recorded (and heard) only now
    for _ in range(500):  # the listener writes the page (bounded wait, real time)
        if online_to(target, friend, 4):
            break
        time.sleep(0.01)
    assert online_to(target, friend, 4)
    clock.shift(grace + 1)
    assert async_to_sync(lifecycle.asweep)().offline == []
    assert online_to(target, friend, 4)


def test_another_sessions_logout_elsewhere_leaves_this_session_online(
    pair: tuple[Any, Any], clock: time_machine.Coordinates
) -> None:
    # Two sessions of one user, pages served by two processes: session A logs out through
    # the other process (its receiver signs the user off; only its own throttle forgets
    # them). Session B's next page here, throttled until then, is written at once.
    target, friend = pair
    grace = get_settings().OFFLINE_GRACE
    session_b = Client()
    session_b.force_login(target)  # written at T0
    clock.shift(2)
    assert session_b.get("/ok/").status_code == 200  # throttled
    clock.shift(1)
    api.sign_off(target)  # session A's logout, at T0+3, in the other process
    heard_close_of(target)
    clock.shift(1)
    assert session_b.get("/ok/").status_code == 200  # T0+4: written at once
    clock.shift(grace + 1)
    assert async_to_sync(lifecycle.asweep)().offline == []
    assert online_to(target, friend, 4)


def test_a_close_with_no_page_after_it_lets_the_user_go_offline(
    pair: tuple[Any, Any], clock: time_machine.Coordinates, redis_commands: RedisCommandCounter
) -> None:
    target, friend = pair
    grace = get_settings().OFFLINE_GRACE
    client = Client()
    client.force_login(target)
    socket(target, "open", 1)
    clock.shift(2)
    assert client.get("/ok/").status_code == 200  # before the close: throttled
    clock.shift(1)
    before = redis_commands.snapshot()
    socket(target, "close", 3)
    heard_close_of(target)
    assert redis_commands.delta(before).get("evalsha") == 1  # the close alone: nothing more
    clock.shift(grace + 2)
    assert async_to_sync(lifecycle.asweep)().offline == [target.pk]
    assert api.get_presence(target, friend).status is Status.OFFLINE


def test_the_throttle_trusts_only_entries_of_the_current_epoch() -> None:
    memory = TouchThrottle()
    memory.epoch = 1
    assert memory.claim(1, now=100.0, interval=30)
    assert not memory.claim(1, now=101.0, interval=30)
    memory.epoch = 0  # the listener lost its subscription: closes may be missed from now on
    assert memory.claim(1, now=102.0, interval=30)
    assert not memory.claim(1, now=103.0, interval=30)  # as before it existed
    memory.epoch = 2  # subscribed again: what was written meanwhile is not trusted
    assert memory.claim(1, now=104.0, interval=30)
    assert not memory.claim(1, now=105.0, interval=30)


def test_the_throttle_on_a_close() -> None:
    memory = TouchThrottle()
    assert memory.claim(1, now=100.2, interval=30)
    memory.note_device(1, "mobile")
    assert memory.closed(1, second=100) is None  # the same second: the close may be the later
    assert memory.claim(1, now=100.5, interval=30)  # ... so the next page writes
    assert not memory.claim(1, now=103.0, interval=30)
    assert memory.closed(1, second=104) is None  # no page since the close: nothing to write
    assert memory.claim(1, now=105.0, interval=30)
    memory.note_device(1, "mobile")
    assert not memory.claim(1, now=107.0, interval=30)  # a page ...
    with time_machine.travel(108.0, tick=False):
        assert memory.closed(1, second=106) == "mobile"  # ... after the close: write it now
    assert not memory.claim(1, now=109.0, interval=30)  # renewed at 108
    assert memory.closed(2, second=106) is None  # a user this process never wrote
    assert memory.claim(1, now=110.0, interval=30) is False
    assert memory.closed(1, second=120) is None  # no page since the close: forgotten
    assert memory.claim(1, now=121.0, interval=30)
