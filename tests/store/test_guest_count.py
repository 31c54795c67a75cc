"""Guests (COUNT_GUESTS): distinct anonymous visitors within ONLINE_WINDOW, counted by the
middleware into a HyperLogLog per time bucket, against the real Redis (the cluster run too).

Off by default (nothing written), distinct visitors counted within the HyperLogLog's error, a
visitor counted once however often they come, gone after ONLINE_WINDOW, no identity in Redis,
and a page served through a Redis outage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import time_machine
from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest, HttpResponse
from django.template import Context, Template
from django.test import Client, RequestFactory
from django.urls import path
from django.utils import translation

from presence import api
from presence.api._counting import COUNT_INTERVAL
from presence.api._guests import visitor_digest
from presence.middleware import PresenceMiddleware
from presence.store import get_store, merge
from tests.clock import T0
from tests.conftest import RedisCommandCounter, cluster_client, cluster_urls

FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0"


def ok_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


async def async_ok_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("ok/", ok_view)]

pytestmark = [
    pytest.mark.urls(__name__),
    pytest.mark.django_db,
    pytest.mark.uuid_site,
    pytest.mark.cluster,
]


@pytest.fixture
def guests_on(settings: Any) -> None:
    settings.PRESENCE = {"COUNT_GUESTS": True}


@pytest.fixture
def raw_redis(redis_url: str) -> Iterator[Any]:
    """A client of presence's Redis that answers bytes (a HyperLogLog is no text)."""
    urls = cluster_urls()
    client = cluster_client(urls) if urls else redis.Redis.from_url(redis_url)
    yield client
    client.close()


def visit(client: Client, address: str, agent: str = FIREFOX) -> None:
    assert client.get("/ok/", REMOTE_ADDR=address, HTTP_USER_AGENT=agent).status_code == 200


def presence_keys(raw: Any) -> list[bytes]:
    """Every key of presence (KEY_PREFIX), on every master, but the marks of the ledger's seed
    each test starts with (tests/conftest.py: a site's Redis holds them), :touched kept too."""
    if cluster_urls():
        from redis.cluster import RedisCluster

        keys = raw.keys("presence:*", target_nodes=RedisCluster.PRIMARIES)
    else:
        keys = raw.keys("presence:*")
    seed_marks = (b":invisible:seeded", b":invisible:touched")
    return sorted(key for key in keys if not key.endswith(seed_marks))


def test_off_by_default_nothing_is_counted_or_written(
    client: Client, redis_commands: RedisCommandCounter, raw_redis: Any
) -> None:
    before = redis_commands.snapshot()
    for n in range(5):
        visit(client, f"10.0.0.{n}")
    assert api.guest_count() == 0  # not even asked
    assert redis_commands.delta(before) == {}
    assert presence_keys(raw_redis) == []


def test_distinct_visitors_are_counted_once_each(
    client: Client, guests_on: None, clock: time_machine.Coordinates
) -> None:
    for n in range(40):
        visit(client, f"10.0.1.{n}")
    visit(client, "10.0.1.0", agent="curl/8.5")  # the same address with another browser
    for n in range(10):
        visit(client, f"10.0.1.{n}")  # back again
    assert api.guest_count() == 41  # exact at this size (Redis's sparse encoding)


def test_a_session_is_one_visitor_wherever_it_comes_from(
    client: Client, guests_on: None, clock: time_machine.Coordinates
) -> None:
    session = client.session  # an anonymous visitor with a session (a cart, a language)
    session["cart"] = [1]
    session.save()
    for n in range(5):
        visit(client, f"10.0.2.{n}")
    assert api.guest_count() == 1


def test_a_visitor_is_written_once_per_bucket_per_process(
    client: Client,
    guests_on: None,
    redis_commands: RedisCommandCounter,
    clock: time_machine.Coordinates,
) -> None:
    assert api.guest_count() == 0  # the store's connection made
    before = redis_commands.snapshot()
    for _ in range(5):
        visit(client, "10.0.3.1")
    # One round trip: PFADD and EXPIRE in one pipeline; the four other requests cost nothing.
    assert redis_commands.delta(before) == {"pfadd": 1, "expire": 1}
    clock.shift(get_store().keys.guest_bucket_seconds())  # the next bucket: written again
    before = redis_commands.snapshot()
    visit(client, "10.0.3.1")
    assert redis_commands.delta(before) == {"pfadd": 1, "expire": 1}
    assert api.guest_count() == 1


def test_visitors_older_than_the_online_window_drop_out(
    client: Client, guests_on: None, clock: time_machine.Coordinates
) -> None:
    window = 300
    bucket = get_store().keys.guest_bucket_seconds()
    assert bucket == window // 10
    visit(client, "10.0.4.1")
    clock.shift(window - 1)
    visit(client, "10.0.4.2")
    assert api.guest_count() == 2  # both within the window
    clock.shift(1 + bucket)  # the first: ONLINE_WINDOW and a bucket ago
    assert api.guest_count() == 1
    clock.shift(window)
    assert api.guest_count() == 0


def test_no_identity_is_stored_and_every_key_expires(
    client: Client, guests_on: None, raw_redis: Any, clock: time_machine.Coordinates
) -> None:
    session = client.session
    session["cart"] = [1]
    session.save()
    secrets = [b"10.0.5.7", FIREFOX.encode(), session.session_key.encode()]
    visit(client, "10.0.5.7")
    anonymous = Client()
    visit(anonymous, "10.0.5.8")
    secrets += [b"10.0.5.8"]
    factory = RequestFactory()
    digests = [
        visitor_digest(factory.get("/", REMOTE_ADDR=a, HTTP_USER_AGENT=FIREFOX), T0.timestamp())
        for a in ("10.0.5.7", "10.0.5.8")
    ]
    secrets += [d.encode() for d in digests]
    keys = presence_keys(raw_redis)
    bucket = get_store().plans.guest_bucket(T0.timestamp())
    assert keys == [f"presence:{{guests}}:{bucket}".encode()]  # and nothing else of presence
    (key,) = keys
    value = raw_redis.get(key)
    assert value.startswith(b"HYLL")  # a HyperLogLog: registers, no elements
    assert not any(secret in value for secret in secrets)
    assert 0 < raw_redis.ttl(key) <= 300 + 30 + 1
    assert api.guest_count() == 2


def test_the_count_is_within_the_hyperloglog_error(
    guests_on: None, clock: time_machine.Coordinates
) -> None:
    # 5,000 distinct digests as the middleware makes them (the bench guest_count measures
    # 10,000 against the same Redis and the error it reports in docs/operations.md).
    store = get_store()
    now = T0.timestamp()
    factory = RequestFactory()
    digests = [
        visitor_digest(factory.get("/", REMOTE_ADDR=f"10.{n // 250}.{n % 250}.9"), now)
        for n in range(5000)
    ]
    for start in range(0, len(digests), 500):
        store.run(merge([store.plans.note_guest(d, now) for d in digests[start : start + 500]]))
    counted = api.guest_count()
    assert abs(counted - 5000) <= 5000 * 3 * 0.0081, counted  # three standard errors


def test_a_redis_outage_never_breaks_a_page(
    client: Client,
    settings: Any,
    private_redis: Any,
    clock: time_machine.Coordinates,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.PRESENCE = {"COUNT_GUESTS": True, "RETRY_INTERVAL": 5}
    visit(client, "10.0.6.1")
    assert api.guest_count() == 1
    private_redis.stop()
    caplog.set_level(logging.WARNING, logger="presence")
    for n in range(4):
        clock.shift(2)
        visit(client, f"10.0.6.{n + 2}")
    assert api.guest_count() == 0  # unknown while Redis is down
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    private_redis.start()  # empty again
    clock.shift(10)
    visit(client, "10.0.6.9")  # counting resumes; a visitor refused meanwhile is tried again
    visit(client, "10.0.6.2")
    assert api.guest_count() == 2


# The member is made on sync_to_async's thread, outside the test's transaction: flushed after.
@pytest.mark.django_db(transaction=True)
async def test_the_async_middleware_counts_guests_and_members_not(
    guests_on: None, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    from asgiref.sync import sync_to_async

    member = await sync_to_async(make_user)()
    middleware = PresenceMiddleware(async_ok_view)

    def request(user: Any, address: str) -> HttpRequest:
        made = RequestFactory().get("/ok/", REMOTE_ADDR=address, HTTP_USER_AGENT=FIREFOX)

        async def auser() -> Any:
            return user

        made.auser = auser  # type: ignore[attr-defined]
        return made

    for n in range(3):
        assert (await middleware(request(AnonymousUser(), f"10.0.7.{n}"))).status_code == 200
    assert (await middleware(request(member, "10.0.7.9"))).status_code == 200
    assert await api.aguest_count() == 3


def test_the_template_tag(client: Client, guests_on: None, clock: time_machine.Coordinates) -> None:
    assert Template("{% load presence %}{% guest_count %}").render(Context({})) == "0"
    store = get_store()
    now = T0.timestamp()
    store.run(merge([store.plans.note_guest(f"{n:016x}", now) for n in range(1234)]))
    clock.shift(COUNT_INTERVAL)  # the 0 above is this process's reading until then
    counted = api.guest_count()
    assert abs(counted - 1234) <= 1234 * 3 * 0.0081
    with translation.override("en"):
        template = Template(
            "{% load presence %}{% guest_count as guests %}{% online_count as members %}"
            "{{ members }} members and {{ guests }} guests online; {% guest_count %}"
        )
        shown = f"{counted:,}"
        assert template.render(Context({})) == (f"0 members and {shown} guests online; {shown}")


def test_every_page_may_show_it_one_pfcount_per_process_per_interval(
    client: Client,
    guests_on: None,
    redis_commands: RedisCommandCounter,
    clock: time_machine.Coordinates,
) -> None:
    visit(client, "10.0.8.1")
    before = redis_commands.snapshot()
    assert [api.guest_count() for _ in range(20)] == [1] * 20
    assert redis_commands.delta(before) == {"pfcount": 1}
    visit(client, "10.0.8.2")
    clock.shift(COUNT_INTERVAL - 1)
    assert api.guest_count() == 1  # this interval's reading
    clock.shift(1)
    assert api.guest_count() == 2
