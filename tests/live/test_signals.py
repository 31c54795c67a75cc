"""presence.signals' user_online / user_offline: one per transition whatever the connections and
sweeps, at the moment friends see it, sent off the event loop, robust to a raising receiver;
and the sweep's claims surviving a sweeper that dies (the lease).

Across real processes: tests/load/test_signals_multiprocess.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import time_machine

from presence import api, lifecycle, outbox, signals
from presence.conf import get_settings
from presence.store import get_store
from tests.clock import at
from tests.conftest import on_one_redis
from tests.live.sockets import (
    Sockets,
    assert_silent,
    diff,
    eventually,
    heartbeat,
    iso,
    lets_see,
    new_user,
    online,
    presence,
    receive,
    state,
    subscribe,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]

Sent = tuple[str, Any, Any, bool]


@pytest.fixture
def received() -> Iterator[list[Sent]]:
    """What user_online / user_offline sent in this test: (kind, user_id, at, invisible)."""
    got: list[Sent] = []

    def on_online(sender: Any, user_id: Any, at: Any, invisible: bool, **kwargs: Any) -> None:
        got.append(("online", user_id, at, invisible))

    def on_offline(sender: Any, user_id: Any, at: Any, invisible: bool, **kwargs: Any) -> None:
        got.append(("offline", user_id, at, invisible))

    signals.user_online.connect(on_online)
    signals.user_offline.connect(on_offline)
    yield got
    signals.wait_sent()
    signals.user_online.disconnect(on_online)
    signals.user_offline.disconnect(on_offline)


async def sent(got: list[Sent], user: Any = None) -> list[Sent]:
    """What was sent (of ``user`` alone where given), once the receivers had it."""
    await asyncio.to_thread(signals.wait_sent)
    return [each for each in got if user is None or each[1] == user.pk]


async def kinds(got: list[Sent], user: Any) -> list[str]:
    return [kind for kind, *_ in await sent(got, user)]


async def later(clock: time_machine.Coordinates, seconds: float) -> None:
    """Move the clock on once the receivers' thread is done with what it was given: in real
    time a caller's claim of its own transition is long done when its outbox deadline comes
    (presence.outbox), but a jump of the test's clock past it would let a sweep claim first."""
    await asyncio.to_thread(signals.wait_sent)
    clock.shift(seconds)


async def test_one_signal_per_transition_whatever_the_connections(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    received: list[Sent],
) -> None:
    grace = get_settings().OFFLINE_GRACE
    user = await new_user(make_user)
    tabs = [await sockets.open(user), await sockets.open(user, "?device=mobile")]
    tabs.append(await sockets.open(user, "?device=desktop"))
    for tab in tabs:
        await heartbeat(tab)
    assert await sent(received) == [("online", user.pk, at(0), False)]

    # Two of three close, then a reload of the last one within the grace: no transition.
    await later(clock, 10)
    await sockets.close(tabs[0])
    await sockets.close(tabs[1])
    await sockets.close(tabs[2])
    await later(clock, grace - 1)
    tab = await sockets.open(user)
    await later(clock, 2)
    await lifecycle.asweep()
    assert await sent(received) == [("online", user.pk, at(0), False)]

    # Closed for good: offline once, when the grace ends (counted from the end of the close's
    # second), whatever the number of sweeps.
    closed = 10 + grace + 1
    await sockets.close(tab)
    await later(clock, grace + 1)
    await asyncio.gather(lifecycle.asweep(), lifecycle.asweep(), lifecycle.asweep())
    await lifecycle.asweep()
    assert await sent(received) == [
        ("online", user.pk, at(0), False),
        ("offline", user.pk, at(closed + 1 + grace), False),
    ]


async def test_page_views_alone_go_offline_after_the_online_window(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, received: list[Sent]
) -> None:
    window = get_settings().ONLINE_WINDOW
    user = await new_user(make_user)
    await api.atouch(user)
    await later(clock, window - 1)
    await api.atouch(user, "mobile")
    await later(clock, 1)
    assert (await lifecycle.asweep()).offline == []
    assert await sent(received) == [("online", user.pk, at(0), False)]
    await later(clock, window - 1)
    assert (await lifecycle.asweep()).offline == [user.pk]
    assert (await lifecycle.asweep()).offline == []
    assert await sent(received) == [
        ("online", user.pk, at(0), False),
        ("offline", user.pk, at(2 * window - 1), False),
    ]


async def test_a_logout_goes_offline_after_the_grace(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, received: list[Sent]
) -> None:
    grace = get_settings().OFFLINE_GRACE
    user = await new_user(make_user)
    await api.atouch(user)
    await later(clock, 5)
    await api.asign_off(user)
    await later(clock, 1 + grace)
    await lifecycle.asweep()
    assert await sent(received) == [
        ("online", user.pk, at(0), False),
        ("offline", user.pk, at(5 + 1 + grace), False),
    ]


async def test_an_invisible_users_signals_say_so(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    received: list[Sent],
) -> None:
    user = await new_user(make_user)
    await api.aset_status(user, "invisible")
    tab = await sockets.open(user)
    assert await sent(received) == [("online", user.pk, at(0), True)]
    assert await api.aonline_count() == 0
    await api.aset_status(user, "auto")
    assert await api.aonline_count() == 1
    await sockets.close(tab)
    await later(clock, 60)
    await lifecycle.asweep()
    offline_at = at(1 + get_settings().OFFLINE_GRACE)
    assert (await sent(received))[1:] == [("offline", user.pk, offline_at, False)]


async def test_receivers_run_off_the_event_loop_and_never_hold_up_a_heartbeat(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    release = threading.Event()
    threads: list[str] = []

    def slow(sender: Any, **kwargs: Any) -> None:
        threads.append(threading.current_thread().name)
        release.wait(10)  # a webhook POSTed inline, say

    signals.user_online.connect(slow)
    try:
        viewer, target = await new_user(make_user), await new_user(make_user)
        await lets_see(target, viewer)
        watcher = await sockets.open(viewer)  # its receiver blocks the signals' thread...
        assert await subscribe(watcher) == state({})
        tab = await sockets.open(target)  # ... yet connections open, frames are answered,
        await heartbeat(tab)
        assert await subscribe(watcher, target) == state({target.pk: online()})
        for _ in range(200):  # the receiver starts once its outbox entry is claimed
            if threads:
                break
            await asyncio.sleep(0.05)
        assert not release.is_set() and threads  # ... while the receiver still waits
    finally:
        release.set()
        await asyncio.to_thread(signals.wait_sent)
        signals.user_online.disconnect(slow)
    assert threads and all(name.startswith("presence-signals") for name in threads)
    assert threading.main_thread().name not in threads


async def test_a_raising_receiver_is_logged_and_the_others_still_run(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    received: list[Sent],
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("the webhook's host is down")

    after: list[Any] = []

    def later_receiver(sender: Any, user_id: Any, **kwargs: Any) -> None:
        after.append(user_id)

    # The recorder's receiver runs before the broken one, this one after it.
    signals.user_online.connect(broken)
    signals.user_online.connect(later_receiver)
    user = await new_user(make_user)
    try:
        with caplog.at_level(logging.ERROR, logger="presence"):
            await api.atouch(user)
            await sent(received)
    finally:
        signals.user_online.disconnect(broken)
        signals.user_online.disconnect(later_receiver)
    assert received == [("online", user.pk, at(0), False)]
    assert after == [user.pk]
    [record] = [r for r in caplog.records if "receiver of user_online" in r.getMessage()]
    assert record.exc_info is not None and "webhook's host is down" in str(record.exc_info[1])
    # ... and the next transition is sent as usual.
    await later(clock, get_settings().ONLINE_WINDOW)
    await lifecycle.asweep()
    assert await kinds(received, user) == ["online", "offline"]


# --- the sweep's lease ------------------------------------------------------------------------


async def _leaving(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> tuple[Any, Any]:
    """A viewer watching a target who closed their last connection; the grace has just ended
    (nobody swept yet): (the viewer's socket, the target)."""
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    tab = await sockets.open(target)
    assert await subscribe(watcher, target) == state({target.pk: online()})
    await sockets.close(tab)
    await later(clock, 1 + get_settings().OFFLINE_GRACE)
    return watcher, target


async def test_users_a_dead_sweeper_claimed_are_swept_once_its_lease_lapses(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    received: list[Sent],
) -> None:
    watcher, target = await _leaving(sockets, make_user, clock)
    store = get_store()
    now = time.time()
    # A sweeper claims the due users, then its process is killed before it checks them.
    due, _ = await store.arun(store.plans.claim_due(now, 500))
    assert due == [target.pk]
    # The other processes' sweeps leave them to it while its lease runs...
    assert (await lifecycle.asweep()).offline == []
    await assert_silent(watcher)
    # ... and take them once it lapsed: the offline diff and the signal, once.
    await later(clock, store.plans.lease_end(now) - now)
    assert (await lifecycle.asweep()).offline == [target.pk]
    assert await receive(watcher) == diff({target.pk: presence("offline", iso(0))})
    assert (await lifecycle.asweep()).offline == []
    assert await kinds(received, target) == ["online", "offline"]


async def test_a_sweeper_killed_after_the_transition_is_announced_by_the_next_no_signal_twice(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    received: list[Sent],
) -> None:
    watcher, target = await _leaving(sockets, make_user, clock)
    store = get_store()
    now = time.time()
    # This sweeper made the transition (and claimed and sent its signal), then died before
    # announcing it to the viewers or giving its claim back.
    due, _ = await store.arun(store.plans.claim_due(now, 500))
    [transition] = [
        await store.arun(store.plans.connection(user_id, "expire", now)) for user_id in due
    ]
    assert transition is not None and transition.made == -1
    outbox.send_made(transition)
    await assert_silent(watcher)
    await later(clock, store.plans.lease_end(now) - now)
    assert (await lifecycle.asweep()).offline == [target.pk]
    assert await receive(watcher) == diff({target.pk: presence("offline", iso(0))})
    assert await kinds(received, target) == ["online", "offline"]


async def test_a_user_due_again_while_leased_is_swept_after_the_lease_is_given_back(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    received: list[Sent],
    settings: Any,
) -> None:
    # A user back online while a sweeper holds them: their new due time is kept, not dropped
    # by another sweeper's claim, so their next offline is noticed too.
    settings.PRESENCE = {**settings.PRESENCE, "ONLINE_WINDOW": 2}
    assert get_settings().ONLINE_WINDOW < get_settings().LIVE_SOCKET_TIMEOUT  # within the lease
    _, target = await _leaving(sockets, make_user, clock)
    store = get_store()
    now = time.time()
    lease = store.plans.lease_end(now)
    assert (await store.arun(store.plans.claim_due(now, 500, lease)))[0] == [target.pk]
    transition = await store.arun(store.plans.connection(target.pk, "expire", now))
    assert transition is not None
    signals.send_transition(target.pk, transition.made, transition.at, transition.invisible)
    await api.atouch(target)  # back, due again ONLINE_WINDOW later
    await later(clock, get_settings().ONLINE_WINDOW)
    assert (await lifecycle.asweep()).offline == []  # still leased: left due
    await store.arun(store.plans.release(lease, [target.pk], {}))
    assert (await lifecycle.asweep()).offline == [target.pk]
    assert await kinds(received, target) == ["online", "offline", "online", "offline"]


@on_one_redis
async def test_a_write_whose_caller_is_cancelled_still_sends_its_signal(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    received: list[Sent],
    redis_client: Any,
    close_async_db_connections: Any,
) -> None:
    # The server gives up on a socket's handler (daphne's application_close_timeout, a process
    # shutting down) while its write is under way: the script runs anyway, and so must the
    # signal it earned.
    user = await new_user(make_user)
    # The write waits in Redis's queue, long enough for the cancel to come first on a busy
    # machine too.
    redis_client.client_pause(2000)
    write = asyncio.ensure_future(lifecycle.aconnect(user, "c1"))
    await asyncio.sleep(0.1)
    write.cancel()
    with pytest.raises(asyncio.CancelledError):
        await write
    assert await eventually(lambda: received)  # once Redis runs the script, however late
    assert await sent(received) == [("online", user.pk, at(0), False)]
