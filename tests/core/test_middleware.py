"""PresenceMiddleware against a real Redis: sync and async paths, throttling, fail-open."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis
import time_machine
from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.test import AsyncClient, Client, RequestFactory
from django.urls import path

from presence import api, signals
from presence.conf import get_settings
from presence.domain import Status
from presence.middleware import PresenceMiddleware, TouchThrottle, listener, throttle
from presence.store import SCORE_FACTOR, get_store
from tests.clock import T0, at
from tests.conftest import RedisCommandCounter, on_one_redis

# Whole seconds: the store keeps activity to the second.

IPHONE = (
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.0 Mobile/15E148 Safari/604.1"
)
ANDROID = "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 Chrome/120 Mobile"
ELECTRON = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/120 Electron/28.0.0"
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0"

#: One write: a single EVALSHA (one command, so one round trip). Redis's commandstats also count
#: the commands the touch script runs inside the server.
# The touch script (ZSCORE + ZADD, then the online ledger's ZADD XX moving the time of a user
# online already: see presence.signals) and the due-time ZADD of the live sweep, in one pipeline.
ONE_TOUCH = {"evalsha": 1, "zscore": 1, "zadd": 3}
# A user coming online is also announced to live connections: a ZCARD of the user's group finds
# it empty (none here), so no group_send follows (presence.announce._GroupSizes; channels_redis's
# group_send would expire stale members and read the group, two round trips, to find the same).
# The transition is recorded in the outbox (TIME, ZADD) and claimed by the caller (ZREM,
# on the signals' thread) before user_online is sent (presence.outbox). Before it is announced,
# the change is stamped (presence.stamps): one script (SET NX of the stamps' epoch, the user's
# ZADD, a ZREMRANGEBYSCORE of stamps past RESUME_WINDOW).
FIRST_TOUCH = {
    **ONE_TOUCH,
    # a user not online yet: the ledger asks whether they are invisible, whether they are
    # online already (ZSCORE), and whether its copy of that choice is there, seeded by this run
    # of Redis (a GET, and an INFO left out of these counts: presence.copies)
    "zscore": 2,
    "sismember": 1,
    "get": 1,
    "zcard": 1,
    "zadd": 5,
    "time": 1,
    "zrem": 1,
    "evalsha": 2,
    "set": 1,
    "zremrangebyscore": 1,
}


def ok_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


async def async_ok_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


# Plain pages of our own: the middleware runs for every page, not only presence's views.
urlpatterns = [path("ok/", ok_view), path("async-ok/", async_ok_view)]

pytestmark = [
    pytest.mark.urls(__name__),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
]


@pytest.fixture(autouse=True)
def _listening(_clean_presence_state: None) -> None:
    """The closes listener (presence.closes) subscribes once per process and store, on its own
    connection: started here, its connection's handshake is not counted as a page's."""
    listener.ensure()


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "presence" and r.levelno == logging.WARNING and text in r.getMessage()
    ]


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


# --- sync path (Django test Client, the full middleware stack) ---------------------------------


def test_request_records_last_seen(
    client: Client, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user = make_user()
    client.force_login(user)  # the login receiver records T0
    clock.shift(get_settings().TOUCH_INTERVAL + 5)

    assert client.get("/ok/").status_code == 200

    own = api.get_presence(user, user)
    assert own.status is Status.ONLINE
    # Only the middleware can have written this time.
    assert own.last_seen == at(get_settings().TOUCH_INTERVAL + 5)


def test_request_within_touch_interval_makes_no_redis_command(
    client: Client,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_commands: RedisCommandCounter,
) -> None:
    interval = get_settings().TOUCH_INTERVAL
    user = make_user()
    client.force_login(user)
    clock.shift(interval)
    client.get("/ok/")  # warms the connection (and loads the script) outside the counts

    clock.shift(interval)
    before = redis_commands.snapshot()
    client.get("/ok/")
    assert redis_commands.delta(before) == ONE_TOUCH

    clock.shift(interval - 1)
    before = redis_commands.snapshot()
    for _ in range(3):
        assert client.get("/ok/").status_code == 200
    assert redis_commands.delta(before) == {}
    assert api.get_presence(user, user).last_seen == at(2 * interval)

    clock.shift(1)  # a full interval since the last write
    before = redis_commands.snapshot()
    client.get("/ok/")
    assert redis_commands.delta(before) == ONE_TOUCH
    assert api.get_presence(user, user).last_seen == at(3 * interval)


def test_throttle_is_per_user(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_commands: RedisCommandCounter,
) -> None:
    alice, bob = make_user(), make_user()
    alice_client, bob_client = Client(), Client()
    alice_client.force_login(alice)
    bob_client.force_login(bob)
    clock.shift(get_settings().TOUCH_INTERVAL)
    alice_client.get("/ok/")

    before = redis_commands.snapshot()
    bob_client.get("/ok/")  # Alice's write just now does not throttle Bob
    assert redis_commands.delta(before) == ONE_TOUCH
    assert api.get_presence(bob, bob).last_seen == at(get_settings().TOUCH_INTERVAL)


def test_anonymous_requests_make_no_redis_command(
    client: Client, make_user: Callable[..., Any], redis_commands: RedisCommandCounter
) -> None:
    before = redis_commands.snapshot()
    for _ in range(3):
        assert client.get("/ok/").status_code == 200
    assert client.get("/no-such-page/").status_code == 404
    assert redis_commands.delta(before) == {}

    # Logged out again: anonymous too.
    client.force_login(make_user())
    client.logout()
    before = redis_commands.snapshot()
    assert client.get("/ok/").status_code == 200
    assert redis_commands.delta(before) == {}


@pytest.mark.parametrize(
    ("user_agent", "device"),
    [(IPHONE, "mobile"), (ANDROID, "mobile"), (ELECTRON, "desktop"), (FIREFOX, "web"), ("", "web")],
    ids=["iphone", "android", "electron", "firefox", "no-user-agent"],
)
def test_device_comes_from_user_agent(
    client: Client,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    user_agent: str,
    device: str,
) -> None:
    user = make_user()
    client.force_login(user)  # as "web", at T0
    # Past the online window the login's device no longer counts.
    clock.shift(get_settings().ONLINE_WINDOW + 1)

    client.get("/ok/", HTTP_USER_AGENT=user_agent)

    assert api.get_presence(user, user).devices == (device,)


def test_devices_of_one_online_stretch_add_up(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user = make_user()
    phone, laptop = Client(HTTP_USER_AGENT=IPHONE), Client(HTTP_USER_AGENT=FIREFOX)
    phone.force_login(user)
    laptop.force_login(user)
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    phone.get("/ok/")
    clock.shift(get_settings().TOUCH_INTERVAL)
    laptop.get("/ok/")

    assert api.get_presence(user, user).devices == ("web", "mobile")


@on_one_redis
def test_concurrent_requests_of_one_user_write_once(
    make_user: Callable[..., Any], redis_commands: RedisCommandCounter
) -> None:
    user = make_user()
    middleware = PresenceMiddleware(ok_view)
    factory = RequestFactory()
    api.touch(make_user())  # warm the store's connection outside the counts
    start = threading.Barrier(16)
    statuses: list[int] = []

    def request() -> None:
        req = factory.get("/ok/")
        req.user = user
        start.wait()
        statuses.append(middleware(req).status_code)

    before = redis_commands.snapshot()
    threads = [threading.Thread(target=request) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert statuses == [200] * 16
    signals.wait_sent()  # the outbox claim
    assert redis_commands.delta(before) == FIRST_TOUCH
    assert api.get_presence(user, user).status is Status.ONLINE


def test_page_is_served_through_a_redis_outage_and_recording_resumes(
    client: Client,
    make_user: Callable[..., Any],
    private_redis: Any,
    settings: Any,
    clock: time_machine.Coordinates,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.PRESENCE = {"TOUCH_INTERVAL": 1, "RETRY_INTERVAL": 5}
    user = make_user()
    client.force_login(user)
    private_redis.stop()
    caplog.set_level(logging.WARNING, logger="presence")

    # T0+2 fails (Redis is left alone until T0+7), T0+4 and T0+6 skip Redis, T0+8 retries.
    for _ in range(4):
        clock.shift(2)
        assert client.get("/ok/").status_code == 200
    assert len(warnings_about(caplog, "Redis is unavailable")) == 1
    assert errors(caplog) == []

    private_redis.start()  # same port, empty: nothing was recorded during the outage
    private = redis.Redis.from_url(private_redis.url, decode_responses=True)
    commands = RedisCommandCounter(private)
    try:
        clock.shift(1)  # T0+9: still within the retry interval of the T0+8 failure
        before = commands.snapshot()
        assert client.get("/ok/").status_code == 200
        assert commands.delta(before) == {}  # Redis is left alone until the interval ends
        assert warnings_about(caplog, "reachable again") == []

        clock.shift(5)  # T0+14: past it; recording resumes by itself
        before = commands.snapshot()
        assert client.get("/ok/").status_code == 200
        assert "evalsha" in commands.delta(before)
        store = get_store()
        score = private.zscore(store.keys.seen_key(store.keys.bucket_of(user.pk)), str(user.pk))
    finally:
        private.close()
    assert len(warnings_about(caplog, "reachable again")) == 1
    assert len(warnings_about(caplog, "Redis is unavailable")) == 1
    assert score is not None and int(score) // SCORE_FACTOR == int(at(14).timestamp())
    own = api.get_presence(user, user)
    assert own.status is Status.ONLINE
    assert own.last_seen == at(14)


def test_request_without_user_passes_through(redis_commands: RedisCommandCounter) -> None:
    # A site whose middleware order is wrong (presence.E007) still serves its pages.
    middleware = PresenceMiddleware(ok_view)
    before = redis_commands.snapshot()
    assert middleware(RequestFactory().get("/ok/")).status_code == 200
    assert redis_commands.delta(before) == {}


@on_one_redis
def test_a_broken_presence_config_does_not_break_pages(
    client: Client,
    make_user: Callable[..., Any],
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # presence.E004 reports this at start-up; pages keep working meanwhile.
    user = make_user()
    client.force_login(user)
    throttle.clear()
    settings.PRESENCE = {"CACHE_ALIAS": "missing"}
    assert client.get("/ok/").status_code == 200
    assert client.get("/ok/").status_code == 200  # throttled: not logged again
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 1 and "could not record activity" in logged[0].getMessage()


# --- the throttle on its own -------------------------------------------------------------------


def test_throttle_claims_once_per_interval() -> None:
    memory = TouchThrottle()
    assert memory.claim(1, now=100.0, interval=30)
    assert not memory.claim(1, now=129.9, interval=30)
    assert memory.claim(1, now=130.0, interval=30)
    # A clock that went backwards must not stop recording for a whole interval.
    assert memory.claim(1, now=50.0, interval=30)
    memory.forget(1)
    assert memory.claim(1, now=51.0, interval=30)


def test_throttle_stays_bounded() -> None:
    memory = TouchThrottle()
    memory.MAX_ENTRIES = 3
    assert memory.claim(1, now=0.0, interval=30)
    assert memory.claim(2, now=0.0, interval=30)
    assert memory.claim(3, now=100.0, interval=30)

    # Full: the entries older than the interval go, the recent one stays throttled.
    assert memory.claim(4, now=101.0, interval=30)
    assert len(memory) == 2
    assert not memory.claim(3, now=102.0, interval=30)

    assert memory.claim(5, now=102.0, interval=30)
    # Full of recent entries: all are forgotten rather than pruned again on every request.
    assert memory.claim(6, now=103.0, interval=30)
    assert len(memory) == 1
    assert memory.claim(3, now=104.0, interval=30)


# --- async path --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_async_stack_records_last_seen_and_throttles(
    async_client: AsyncClient,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_commands: RedisCommandCounter,
) -> None:
    interval = get_settings().TOUCH_INTERVAL
    user = await make_async_user(make_user)
    await async_client.aforce_login(user)
    clock.shift(interval)

    response = await async_client.get("/async-ok/", headers={"user-agent": IPHONE})

    assert response.status_code == 200
    own = await api.aget_presence(user, user)
    assert own.status is Status.ONLINE
    assert own.last_seen == at(interval)
    assert own.devices == ("web", "mobile")  # web from the login, mobile from this page

    clock.shift(interval - 1)
    before = redis_commands.snapshot()
    assert (await async_client.get("/async-ok/")).status_code == 200
    assert redis_commands.delta(before) == {}

    clock.shift(1)
    before = redis_commands.snapshot()
    await async_client.get("/async-ok/")
    assert redis_commands.delta(before) == ONE_TOUCH
    assert (await api.aget_presence(user, user)).last_seen == at(2 * interval)


async def make_async_user(make_user: Callable[..., Any]) -> Any:
    from asgiref.sync import sync_to_async

    return await sync_to_async(make_user)()


def async_request(user: Any, user_agent: str = FIREFOX) -> HttpRequest:
    """A request as AuthenticationMiddleware leaves it on the async path: with ``auser``."""
    request = RequestFactory().get("/async-ok/", HTTP_USER_AGENT=user_agent)

    async def auser() -> Any:
        return user

    request.auser = auser  # type: ignore[attr-defined]
    return request


def async_middleware() -> tuple[PresenceMiddleware, list[HttpRequest]]:
    seen: list[HttpRequest] = []

    async def get_response(request: HttpRequest) -> HttpResponse:
        seen.append(request)
        return HttpResponse("ok")

    middleware = PresenceMiddleware(get_response)
    return middleware, seen


async def live_state(user: Any) -> Any:
    store = get_store()
    states = await store.arun(store.plans.read([user.pk]))
    assert states is not None
    return states.get(user.pk)


@pytest.fixture
def two_users(make_user: Callable[..., Any]) -> tuple[Any, Any]:
    # Made outside the event loop; the async middleware itself needs no database here.
    return make_user(), make_user()


@on_one_redis
async def test_async_middleware_records_and_throttles(
    two_users: tuple[Any, Any],
    clock: time_machine.Coordinates,
    redis_commands: RedisCommandCounter,
) -> None:
    user, other = two_users
    middleware, seen = async_middleware()
    assert iscoroutinefunction(middleware)
    # Warm up with another user: a new connection handshakes and may load the script.
    await api.atouch(other)

    before = redis_commands.snapshot()
    response = await middleware(async_request(user, IPHONE))
    signals.wait_sent()  # the outbox claim
    assert redis_commands.delta(before) == FIRST_TOUCH
    assert response.status_code == 200 and len(seen) == 1

    state = await live_state(user)
    assert state.last_active == T0.timestamp()
    assert [d.value for d in state.devices] == ["mobile"]

    clock.shift(get_settings().TOUCH_INTERVAL - 1)
    before = redis_commands.snapshot()
    await middleware(async_request(user))
    assert redis_commands.delta(before) == {}

    clock.shift(1)
    await middleware(async_request(user))
    assert (await live_state(user)).last_active == at(get_settings().TOUCH_INTERVAL).timestamp()


async def test_async_anonymous_requests_make_no_redis_command(
    redis_commands: RedisCommandCounter,
) -> None:
    from django.contrib.auth.models import AnonymousUser

    middleware, seen = async_middleware()
    no_auser = RequestFactory().get("/async-ok/")  # no AuthenticationMiddleware at all
    before = redis_commands.snapshot()
    await middleware(async_request(AnonymousUser()))
    await middleware(no_auser)
    assert redis_commands.delta(before) == {}
    assert len(seen) == 2


async def test_async_page_is_served_through_a_redis_outage(
    two_users: tuple[Any, Any],
    private_redis: Any,
    settings: Any,
    clock: time_machine.Coordinates,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.PRESENCE = {"TOUCH_INTERVAL": 1, "RETRY_INTERVAL": 5}
    user, _ = two_users
    middleware, _ = async_middleware()
    await middleware(async_request(user))  # connects while Redis is up
    private_redis.stop()
    caplog.set_level(logging.WARNING, logger="presence")

    for _ in range(4):
        clock.shift(2)
        assert (await middleware(async_request(user))).status_code == 200
    assert len(warnings_about(caplog, "Redis is unavailable")) == 1
    assert errors(caplog) == []

    private_redis.start()
    clock.shift(6)  # T0+14, past the retry interval of the T0+8 failure
    assert (await middleware(async_request(user))).status_code == 200
    assert len(warnings_about(caplog, "reachable again")) == 1
    assert (await live_state(user)).last_active == at(14).timestamp()
