"""Login touches, logout signs off; both against a real Redis and the database."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from django.contrib.auth import alogin, alogout, login
from django.contrib.sessions.backends.db import SessionStore
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory
from django.urls import path

from presence import api, signals
from presence.conf import get_settings
from presence.domain import Status
from presence.middleware import throttle
from presence.models import Contact, LastSeen, PrivacySettings, UserStatus
from tests.clock import T0, at
from tests.conftest import RedisCommandCounter

IPHONE = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) Mobile/15E148 Safari/604.1"
# commandstats count the script's commands (with the online ledger's SISMEMBER and ZADD, see
# presence.signals); the last ZADD schedules the live sweep, and a user coming online is
# announced: a ZCARD of the user's channel-layer group finds it empty (no members here), so no
# group_send follows (presence.announce._GroupSizes: channels_redis's own would cost two
# round trips, ZREMRANGEBYSCORE and ZRANGE, to find the same).
FIRST_TOUCH = {
    # the touch script, and the change's stamp before it is announced (presence.stamps: one
    # script, SET NX of the stamps' epoch, the user's ZADD, a ZREMRANGEBYSCORE of old stamps)
    "evalsha": 2,
    "set": 1,
    "zremrangebyscore": 1,
    "zscore": 2,
    "zadd": 5,
    # the ledger asks whether the user is invisible, whether they are online already (ZSCORE),
    # and whether its copy of that choice is there, seeded by this run of Redis (a GET, and an
    # INFO left out of these counts: presence.copies)
    "sismember": 1,
    "get": 1,
    "zcard": 1,
    # the outbox: recorded by the script (TIME, ZADD), claimed by the caller (presence.outbox)
    "time": 1,
    "zrem": 1,
}


def ok_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("ok/", ok_view)]
pytestmark = [
    pytest.mark.urls(__name__),
    pytest.mark.uuid_site,
]


def make_pair(make_user: Callable[..., Any]) -> tuple[Any, Any]:
    """A target and a friend who may see the target's online status and last seen."""
    target, friend = make_user(), make_user()
    Contact.objects.create(owner=target, contact=friend)
    Contact.objects.create(owner=friend, contact=target)
    return target, friend


@pytest.fixture
def pair(make_user: Callable[..., Any]) -> tuple[Any, Any]:
    return make_pair(make_user)


def test_login_makes_the_user_online_at_once(
    pair: tuple[Any, Any], clock: time_machine.Coordinates
) -> None:
    target, friend = pair
    assert api.get_presence(target, friend).status is Status.OFFLINE

    assert Client().login(username=target.username, password="pw")

    seen = api.get_presence(target, friend)
    assert seen.status is Status.ONLINE
    assert seen.last_seen == T0


def test_login_writes_even_when_the_throttle_remembers_the_user(
    pair: tuple[Any, Any], clock: time_machine.Coordinates, redis_commands: RedisCommandCounter
) -> None:
    target, friend = pair
    api.touch(friend)  # warm the connection outside the counts
    throttle.mark(target.pk)  # as if a page of this process had just written (Redis then flushed)

    before = redis_commands.snapshot()
    Client().force_login(target)
    signals.wait_sent()  # the outbox claim
    assert redis_commands.delta(before) == FIRST_TOUCH
    assert api.get_presence(target, friend).status is Status.ONLINE


def test_the_page_after_login_does_not_write_again(
    pair: tuple[Any, Any], clock: time_machine.Coordinates, redis_commands: RedisCommandCounter
) -> None:
    target, _ = pair
    client = Client()
    client.force_login(target)
    clock.shift(1)
    before = redis_commands.snapshot()
    assert client.get("/ok/").status_code == 200
    assert redis_commands.delta(before) == {}


def test_login_records_the_device_of_the_request(
    pair: tuple[Any, Any], clock: time_machine.Coordinates
) -> None:
    target, _ = pair
    request = RequestFactory().post("/login/", HTTP_USER_AGENT=IPHONE)
    request.session = SessionStore()
    login(request, target)
    assert api.get_presence(target, target).devices == ("mobile",)


def test_logout_signs_off_after_the_grace(
    pair: tuple[Any, Any], clock: time_machine.Coordinates
) -> None:
    target, friend = pair
    grace = get_settings().OFFLINE_GRACE
    client = Client()
    client.force_login(target)
    clock.shift(10)

    client.logout()

    # Not yet offline to others: a logout-and-back-in must not flap.
    assert api.get_presence(target, friend).status is Status.ONLINE
    # The full grace: it counts from the end of the logout's second (the second the store keeps).
    clock.shift(grace + 0.99)
    assert api.get_presence(target, friend).status is Status.ONLINE
    clock.shift(0.01)
    seen = api.get_presence(target, friend)
    assert seen.status is Status.OFFLINE
    assert seen.last_seen == at(10)
    assert api.get_presence(target, target).status is Status.OFFLINE
    # Persisted in the database too.
    assert LastSeen.objects.get(user=target).seen_at == at(10)


def test_logout_persists_last_seen_through_a_redis_outage(
    pair: tuple[Any, Any],
    private_redis: Any,
    clock: time_machine.Coordinates,
    caplog: pytest.LogCaptureFixture,
) -> None:
    target, _ = pair
    client = Client()
    client.force_login(target)
    private_redis.stop()
    clock.shift(20)

    client.logout()  # must not fail

    assert LastSeen.objects.get(user=target).seen_at == at(20)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    # Logging in through the outage works too.
    assert Client().login(username=target.username, password="pw")


def test_relogin_after_logout_within_touch_interval_is_online_again(
    pair: tuple[Any, Any], clock: time_machine.Coordinates
) -> None:
    target, friend = pair
    client = Client()
    client.force_login(target)
    clock.shift(2)
    client.logout()
    clock.shift(1)
    client.force_login(target)  # 3 s after the first login: well within TOUCH_INTERVAL
    clock.shift(1)
    client.get("/ok/")

    clock.shift(get_settings().OFFLINE_GRACE + 1)
    seen = api.get_presence(target, friend)
    assert seen.status is Status.ONLINE
    assert seen.last_seen == at(3)


def test_logout_of_one_session_lets_another_session_be_recorded_again(
    pair: tuple[Any, Any], clock: time_machine.Coordinates
) -> None:
    target, friend = pair
    laptop, desktop = Client(), Client()
    laptop.force_login(target)
    desktop.force_login(target)
    clock.shift(get_settings().TOUCH_INTERVAL)
    desktop.get("/ok/")  # written, so throttled for a while
    clock.shift(5)
    laptop.logout()

    clock.shift(1)
    desktop.get("/ok/")  # still logged in here: the logout forgot the throttle

    clock.shift(get_settings().OFFLINE_GRACE + 1)
    seen = api.get_presence(target, friend)
    assert seen.status is Status.ONLINE
    assert seen.last_seen == at(get_settings().TOUCH_INTERVAL + 6)


@pytest.mark.django_db
def test_anonymous_logout_does_nothing(client: Client, redis_commands: RedisCommandCounter) -> None:
    before = redis_commands.snapshot()
    client.logout()
    assert redis_commands.delta(before) == {}
    assert LastSeen.objects.count() == 0


def test_login_and_logout_survive_a_broken_presence_config(
    pair: tuple[Any, Any], settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # presence.E004 reports this at start-up; logging in and out must still work.
    target, _ = pair
    settings.PRESENCE = {"CACHE_ALIAS": "missing"}
    client = Client()
    assert client.login(username=target.username, password="pw")
    assert client.get("/ok/").status_code == 200
    client.logout()
    assert "_auth_user_id" not in client.session
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("login" in m for m in logged) and any("logout" in m for m in logged)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_async_login_and_logout(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    target, friend = await sync_to_async(make_pair)(make_user)
    request = RequestFactory().post("/login/", HTTP_USER_AGENT=IPHONE)
    request.session = SessionStore()

    await alogin(request, target)
    seen = await api.aget_presence(target, friend)
    assert seen.status is Status.ONLINE and seen.devices == ("mobile",)

    clock.shift(7)

    async def auser() -> Any:  # as AuthenticationMiddleware provides it; alogout awaits it
        return target

    request.auser = auser  # type: ignore[attr-defined]
    await alogout(request)
    clock.shift(get_settings().OFFLINE_GRACE)  # the full grace, from the end of the second
    assert (await api.aget_presence(target, friend)).status is Status.ONLINE
    clock.shift(1)
    assert (await api.aget_presence(target, friend)).status is Status.OFFLINE
    assert (await LastSeen.objects.aget(user=target)).seen_at == at(7)


# --- presence_changed ---------------------------------------------------------------------


@pytest.fixture
def changes() -> Any:
    """Every presence_changed sent during the test, as (user_id, reason)."""
    from presence.signals import presence_changed

    seen: list[tuple[int, str]] = []

    def listen(sender: Any, user_id: int, reason: str, **kwargs: Any) -> None:
        seen.append((user_id, reason))

    presence_changed.connect(listen)
    yield seen
    presence_changed.disconnect(listen)


def test_graph_and_privacy_changes_are_announced_after_commit(
    make_user: Callable[..., Any],
    changes: list[tuple[int, str]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    from presence.models import Block, PrivacySettings

    a, b = make_user(), make_user()
    with django_capture_on_commit_callbacks(execute=False) as pending:
        contact = Contact.objects.create(owner=a, contact=b)
    assert changes == []  # nothing before the transaction commits
    for callback in pending:
        callback()
    assert changes == [(a.pk, "contacts")]

    changes.clear()
    with django_capture_on_commit_callbacks(execute=True):
        contact.close_friend = True
        contact.save()
        contact.delete()
        block = Block.objects.create(blocker=b, blocked=a)
        block.delete()
        settings = PrivacySettings.objects.create(user=b, online_visibility="nobody")
        settings.delete()
    assert changes == [
        (a.pk, "contacts"),
        (a.pk, "contacts"),
        (b.pk, "block"),
        (a.pk, "block"),
        (b.pk, "block"),
        (a.pk, "block"),
        (b.pk, "privacy"),
        (b.pk, "privacy"),
    ]


def test_set_status_is_announced(
    make_user: Callable[..., Any],
    changes: list[tuple[int, str]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    user = make_user()
    with django_capture_on_commit_callbacks(execute=True):
        api.set_status(user, "dnd", text="busy")
    # Once per change, whatever it stores (the invisible flag lives in PrivacySettings).
    assert changes == [(user.pk, "status")]
    for status in ("invisible", "invisible", "auto", "dnd"):
        changes.clear()
        with django_capture_on_commit_callbacks(execute=True):
            api.set_status(user, status)
        assert changes == [(user.pk, "status")], status
        assert PrivacySettings.objects.get(user=user).invisible is (status == "invisible")


# --- UserStatus rows saved by the site or the admin --------------------------------------------


@pytest.fixture
def status_changes() -> Any:
    """The (user, reason) of each presence_changed sent."""
    sent: list[tuple[Any, str]] = []

    def receiver(sender: Any, user_id: Any, reason: str, **kwargs: Any) -> None:
        sent.append((user_id, reason))

    signals.presence_changed.connect(receiver)
    yield sent
    signals.presence_changed.disconnect(receiver)


def test_a_status_change_is_told_once_whoever_saves_the_row(
    make_user: Callable[..., Any],
    status_changes: list[tuple[Any, str]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    ann = make_user()
    with django_capture_on_commit_callbacks(execute=True):
        api.set_status(ann, "dnd", text="Focus")  # the API announces it, not the receivers
    assert status_changes == [(ann.pk, "status")]
    status_changes.clear()
    row = UserStatus.objects.get(user=ann)
    with django_capture_on_commit_callbacks(execute=True):
        row.save()  # saved as it was: nothing to tell
        row.text = "Lunch"
        row.save()
    assert status_changes == [(ann.pk, "status")]


def test_deleting_a_status_row_loaded_before_a_change_tells_what_the_row_held(
    make_user: Callable[..., Any],
    status_changes: list[tuple[Any, str]],
    django_capture_on_commit_callbacks: Any,
) -> None:
    ann = make_user()
    UserStatus.objects.create(user=ann)  # an empty row, loaded by a view of the site
    row = UserStatus.objects.get(user=ann)
    with django_capture_on_commit_callbacks(execute=True):
        api.set_status(ann, "dnd", text="Focus")  # meanwhile, through the API
    status_changes.clear()
    with django_capture_on_commit_callbacks(execute=True):
        row.delete()  # the row held dnd and "Focus": its watchers are told it went
    assert api.get_presence(ann, ann).text is None
    assert status_changes == [(ann.pk, "status")]
