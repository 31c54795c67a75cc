"""api.online_count and {% online_count %}: users online now, invisible users left out, right at
once after a transition (no sweep needed), a bounded number of Redis commands whatever the
number online, a drift put right by presence_cleanup; and the ledger's "exactly one caller
makes each transition" under racing writers of several processes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import time_machine
from django.template import Context, Template
from django.utils import translation

from presence import api, signals
from presence.conf import get_settings
from presence.domain import Device
from presence.models import PrivacySettings
from presence.store import PresenceStore, StoreUnavailable, get_store, merge
from tests.clock import T0
from tests.conftest import RedisCommandCounter
from tests.store.stores import down_store as down_store

pytestmark = [pytest.mark.django_db, pytest.mark.uuid_site, pytest.mark.cluster]


@pytest.fixture
def offline_sent() -> Iterator[list[Any]]:
    got: list[Any] = []

    def record(sender: Any, user_id: Any, **kwargs: Any) -> None:
        got.append(user_id)

    signals.user_offline.connect(record)
    yield got
    signals.user_offline.disconnect(record)


def touch_many(count: int, first: int = 10_000) -> None:
    """``count`` users (ids only) seen by a page view now, in one round trip."""
    store = get_store()
    now = T0.timestamp()
    store.run(merge([store.plans.touch(first + i, Device.WEB, now) for i in range(count)]))


def test_counts_the_users_online_and_leaves_invisible_ones_out(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    django_capture_on_commit_callbacks: Any,
) -> None:
    first, second, third = make_user(), make_user(), make_user()
    assert api.online_count() == 0
    for user in (first, second, third):
        api.touch(user)
    api.touch(first, "mobile")  # a user counts once, whatever their devices
    assert api.online_count() == 3
    # (inside the test's transaction, as in a request's: Redis's copy follows its commit)
    with django_capture_on_commit_callbacks(execute=True):
        api.set_status(second, "invisible")
    assert api.online_count() == 2
    settings = PrivacySettings.objects.get_or_create(user=third)[0]
    settings.invisible = True
    with django_capture_on_commit_callbacks(execute=True):
        settings.save()  # as the admin or a site's form would
    assert api.online_count() == 1
    with django_capture_on_commit_callbacks(execute=True):
        api.set_status(second, "dnd")  # dnd is online
        settings.delete()
    assert api.online_count() == 3


async def test_the_async_twin(make_user: Callable[..., Any], clock: Any) -> None:
    touch_many(3)
    assert await api.aonline_count() == 3


def test_right_at_once_after_a_transition_without_a_sweep(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    conf = get_settings()
    store = get_store()
    reader, socket_user = make_user(), make_user()
    api.touch(reader)
    store.run(store.plans.connection(socket_user.pk, "open", T0.timestamp(), "c1"))
    assert api.online_count() == 2
    clock.shift(10)
    store.run(store.plans.connection(socket_user.pk, "close", T0.timestamp() + 10, "c1"))
    clock.shift(conf.OFFLINE_GRACE)  # the grace counts from the end of the close's second
    assert api.online_count() == 2
    clock.shift(1)
    assert api.online_count() == 1
    clock.shift(conf.ONLINE_WINDOW - 11 - conf.OFFLINE_GRACE - 1)
    assert api.online_count() == 1
    clock.shift(1)
    assert api.online_count() == 0


def test_a_bounded_number_of_redis_commands_whatever_the_number_online(
    redis_commands: RedisCommandCounter, clock: time_machine.Coordinates
) -> None:
    store = get_store()
    per_read = len(list(store.keys.shards()))  # one on one Redis, one per shard on a cluster
    touch_many(10)
    before = redis_commands.snapshot()
    assert api.online_count() == 10
    few = redis_commands.delta(before)
    touch_many(2000, first=20_000)
    before = redis_commands.snapshot()
    assert api.online_count() == 2010
    many = redis_commands.delta(before)
    assert few == many == {"zcount": per_read}


def test_localized_in_the_template_tag(clock: time_machine.Coordinates) -> None:
    touch_many(1234)
    template = Template("{% load presence %}<b>{% online_count %}</b> online")
    # In an element presence.js keeps live, naming the endpoint it polls without a socket.
    live = (
        '<b><span class="presence-online-count" '
        'data-presence-online-count="/presence/api/online_count">{}</span></b> online'
    )
    with translation.override("en"):
        assert template.render(Context({})) == live.format("1,234")
    with translation.override("de"):
        assert template.render(Context({})) == live.format("1.234")
    with translation.override("vi"):  # Vietnamese does not group digits
        assert template.render(Context({})) == live.format("1234")
    assert Template("{% load presence %}{% online_count as n %}[{{ n }}]").render(Context({})) == (
        "[1,234]"
    )


def test_zero_when_redis_is_unavailable(down_store: PresenceStore) -> None:
    assert api.online_count() == 0


def test_presence_cleanup_puts_a_drift_of_invisibility_right(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    hidden, shown = make_user(), make_user()
    api.touch(hidden)
    api.touch(shown)
    # Set in the database without a save signal, and in Redis without the database.
    PrivacySettings.objects.bulk_create([PrivacySettings(user=hidden, invisible=True)])
    store = get_store()
    store.run(store.plans.set_invisible(shown.pk, True))
    assert api.online_count() == 1  # both wrong
    assert api.cleanup(dry_run=True).invisible_fixed == 2
    assert api.online_count() == 1  # a dry run changes nothing
    assert api.cleanup().invisible_fixed == 2
    assert api.online_count() == 1
    assert store.run(store.plans.invisible_members()) == {hidden.pk}
    assert api.cleanup().invisible_fixed == 0


@pytest.mark.parametrize("saved", ["before", "after"])
def test_a_user_turning_invisible_while_presence_cleanup_runs_stays_invisible(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
    saved: str,
) -> None:
    """The user saves invisible=True while cleanup compares the database with Redis: just
    before or just after its read of Redis's invisible members, whichever it reads first."""
    user = make_user()
    api.touch(user)
    store = get_store()
    plans = store.plans
    read = plans.invisible_members

    def save() -> None:
        # The save and its commit: the database, then Redis's copy (presence.receivers).
        with django_capture_on_commit_callbacks(execute=True):
            PrivacySettings.objects.update_or_create(user=user, defaults={"invisible": True})

    def invisible_members() -> Any:
        if saved == "before":
            save()
            return read()
        plan = read()
        return replace(plan, parse=lambda replies: (plan.parse(replies), save())[0])

    monkeypatch.setattr(plans, "invisible_members", invisible_members)
    api.cleanup()
    monkeypatch.undo()
    assert store.run(store.plans.invisible_members()) == {user.pk}
    assert api.online_count() == 0


def test_presence_cleanup_makes_the_users_nobody_swept_offline_once(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, offline_sent: list[Any]
) -> None:
    # A site without live processes: nobody sweeps; the count is right anyway, and cleanup
    # makes the transition (one signal) as it removes the entry.
    user = make_user()
    api.touch(user)
    clock.shift(2 * get_settings().ONLINE_WINDOW)
    assert api.online_count() == 0
    store = get_store()
    assert store.run(store.plans.ledger_sizes())["online"] == 1
    assert api.cleanup().removed == 1
    assert api.cleanup().removed == 0
    signals.wait_sent()
    assert offline_sent == [user.pk]
    assert store.run(store.plans.ledger_sizes())["online"] == 0


def test_presence_cleanup_whose_removal_reply_is_lost_still_sends_the_offline_once(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    offline_sent: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis ran cleanup's removal (the user left the ledger) but its reply never came back
    (late past SOCKET_TIMEOUT, a connection cut): the offline it made is in the outbox, so a
    later cleanup sends it, once."""
    user = make_user()
    api.touch(user)
    clock.shift(2 * get_settings().ONLINE_WINDOW)
    store = get_store()
    plans = store.plans
    remove = plans.remove_stale

    def reply_lost(entries: Any, now: float) -> Any:
        plan = remove(entries, now)

        def parse(replies: list[Any]) -> Any:
            raise StoreUnavailable("Redis is too slow: no reply within SOCKET_TIMEOUT")

        return replace(plan, parse=parse)

    monkeypatch.setattr(plans, "remove_stale", reply_lost)
    with pytest.raises(StoreUnavailable):
        api.cleanup()
    monkeypatch.undo()
    assert store.run(store.plans.ledger_sizes())["online"] == 0  # Redis did run it
    assert api.cleanup().removed == 0  # (nothing left to remove)
    clock.shift(get_settings().LIVE_SOCKET_TIMEOUT + 2)  # past the outbox's deadline
    api.cleanup()
    api.cleanup()
    signals.wait_sent()
    assert offline_sent == [user.pk]


def test_racing_writers_of_many_processes_make_each_transition_once(
    clock: time_machine.Coordinates,
) -> None:
    # Each thread is a process of its own (its own store and clients): all open a connection
    # of one user at once, then all close theirs, then all sweep the user at once.
    conf = get_settings()
    writers = 8
    stores = [PresenceStore(conf) for _ in range(writers)]
    now = T0.timestamp()
    made: list[int] = []
    lock = threading.Lock()

    def race(op: Callable[[int, PresenceStore], Any]) -> None:
        start = threading.Barrier(writers)

        def one(i: int) -> None:
            start.wait()
            transition = stores[i].run(op(i, stores[i]))
            with lock:
                made.append(transition.made)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    try:
        race(lambda i, store: store.plans.connection(7, "open", now, f"c{i}"))
        assert sorted(made) == [0] * (writers - 1) + [1]
        made.clear()
        race(lambda i, store: store.plans.connection(7, "close", now + 1, f"c{i}"))
        assert made == [0] * writers  # still online for the grace
        made.clear()
        after = now + 2 + conf.OFFLINE_GRACE
        race(lambda i, store: store.plans.connection(7, "expire", after))
        assert sorted(made) == [-1] + [0] * (writers - 1)
    finally:
        for store in stores:
            store.close()


# --- GET presence/api/online_count (the polling fallback of {% online_count %}) ----------------


def test_the_endpoint_answers_anyone_the_count(
    client: Any, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    touch_many(3)
    response = client.get("/presence/api/online_count")  # anonymous: no login needed
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"count": 3}
    assert response["Cache-Control"] == "public, max-age=5"
    refused = client.post("/presence/api/online_count")
    assert refused.status_code == 405
    assert refused["Allow"] == "GET"
    assert refused.json()["error"]["code"] == "method_not_allowed"


def test_the_endpoint_reads_redis_once_per_process_per_interval(
    client: Any, redis_commands: RedisCommandCounter, clock: time_machine.Coordinates
) -> None:
    per_read = len(list(get_store().keys.shards()))
    touch_many(3)
    before = redis_commands.snapshot()
    assert [client.get("/presence/api/online_count").json() for _ in range(10)] == [
        {"count": 3}
    ] * 10
    assert redis_commands.delta(before) == {"zcount": per_read}
    touch_many(2, first=50_000)
    clock.shift(4)
    assert client.get("/presence/api/online_count").json() == {"count": 3}  # this interval's
    clock.shift(1)
    assert client.get("/presence/api/online_count").json() == {"count": 5}
