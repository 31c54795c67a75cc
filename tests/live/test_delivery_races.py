"""The hub's deliveries against what happens to a connection while one is under way: a
subscription ended and made again, a client that reads nothing, a delivery due only to some
connections when they leave. Real channels_redis layer, real Redis; races are forced with
events (a read held until the test lets it go), never with timing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import time_machine

from presence import announce, consumers, lifecycle
from presence.hub import Hub
from tests.clock import at
from tests.live import test_fresh_stamps as fresh_stamps
from tests.live.sockets import (
    APP,
    BASE,
    TIMEOUT,
    Sockets,
    assert_silent,
    diff,
    eventually,
    lets_see,
    new_user,
    online,
    receive,
    set_status,
    state,
    subscribe,
)

# The fixtures: the settings every test starts from (autouse), the sockets.
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets
from tests.live.test_hub import unreachable_presence_redis

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
]


def _held_once(real: Callable[..., Awaitable[Any]]) -> tuple[Any, asyncio.Event, asyncio.Event]:
    """``real`` as a function whose next call, once ``hold`` is set, returns only after the
    test sets ``release``; ``held`` is set once that call has its result (it has read)."""
    hold, held, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def wrapped(*args: Any) -> Any:
        result = await real(*args)
        if hold.is_set() and not held.is_set():
            held.set()
            await release.wait()
        return result

    wrapped.hold = hold  # type: ignore[attr-defined]
    return wrapped, held, release


async def test_a_round_read_before_an_unsubscribe_and_a_subscribe_again_sends_nothing_older(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round reads the target's presence ("A") and is held; meanwhile the viewer
    unsubscribes, the target changes to "B" (nobody here watches it: no delivery) and the
    viewer subscribes again, its snapshot showing "B". The round's older reading must not
    follow that snapshot: the client would show "A" until the target changed again."""
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    tab = await sockets.open(target)
    watching = await sockets.open(viewer)
    assert await subscribe(watching, target) == state({target.pk: online()})
    resolve, read, release = _held_once(lifecycle.apresence_for_viewers)
    monkeypatch.setattr(lifecycle, "apresence_for_viewers", resolve)
    resolve.hold.set()
    await set_status(tab, status="auto", text="A")
    await asyncio.wait_for(read.wait(), TIMEOUT)  # the round has read "A"
    await watching.send_json_to({"type": "unsubscribe", "users": [str(target.pk)]})
    await set_status(tab, status="auto", text="B")
    assert await subscribe(watching, target) == state({target.pk: online(text="B")})
    release.set()
    # The round delivers again after it, compared with the snapshot: nothing to tell.
    await assert_silent(watching)
    await set_status(tab, status="auto", text="C")
    assert await receive(watching) == diff({target.pk: online(text="C")})


def _app_holding_a_diff(held: asyncio.Event, drained: asyncio.Event) -> Any:
    """The app behind a server whose send waits (uvicorn, the client's transport full): the
    first presence_diff goes to the client, then its send returns only once ``drained``."""

    async def app(scope: Any, receive_: Any, send: Any) -> None:
        async def server_send(message: dict[str, Any]) -> None:
            await send(message)
            if '"presence_diff"' in message.get("text", "") and not held.is_set():
                held.set()
                await drained.wait()

        await APP(scope, receive_, server_send)

    return app


async def test_a_client_that_reads_nothing_holds_up_no_later_diff_of_another_connection(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a server whose send waits, a client that reads nothing holds its own send up to
    SEND_TIMEOUT: the diffs of other users to other connections, in later rounds, go out
    meanwhile (not after its SEND_TIMEOUT); its own frames still go in order."""
    monkeypatch.setattr(consumers.sending, "SEND_TIMEOUT", 60.0)  # longer than any wait here
    slow_viewer, fast_viewer, x, y = [await new_user(make_user) for _ in range(4)]
    await lets_see(x, slow_viewer)
    await lets_see(y, fast_viewer)
    x_tab, y_tab = await sockets.open(x), await sockets.open(y)
    held, drained = asyncio.Event(), asyncio.Event()
    slow = sockets.make(slow_viewer, app=_app_holding_a_diff(held, drained))
    assert (await slow.connect(timeout=TIMEOUT))[0]
    assert await subscribe(slow, x) == state({x.pk: online()})
    fast = await sockets.open(fast_viewer)
    assert await subscribe(fast, y) == state({y.pk: online()})
    await set_status(x_tab, status="auto", text="one")
    await asyncio.wait_for(held.wait(), TIMEOUT)  # the slow client's send waits
    await set_status(x_tab, status="auto", text="two")  # a diff queued behind it
    await set_status(y_tab, status="auto", text="y changed")
    # While the slow client's send is still held.
    assert await receive(fast) == diff({y.pk: online(text="y changed")})
    assert not drained.is_set()
    drained.set()
    assert await receive(slow) == diff({x.pk: online(text="one")})
    assert await receive(slow) == diff({x.pk: online(text="two")})


async def test_a_diff_queued_behind_a_held_send_gives_way_to_a_newer_snapshot(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
) -> None:
    """A diff waiting for the connection's earlier send to return is looked at again when it
    goes: a subscription made again since (unsubscribe, subscribe) has sent a newer snapshot,
    which the older diff must not undo."""
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    tab = await sockets.open(target)
    held, drained = asyncio.Event(), asyncio.Event()
    slow = sockets.make(viewer, app=_app_holding_a_diff(held, drained))
    assert (await slow.connect(timeout=TIMEOUT))[0]
    assert await subscribe(slow, target) == state({target.pk: online()})
    hub = Hub.current()
    assert hub is not None
    await set_status(tab, status="auto", text="one")
    await asyncio.wait_for(held.wait(), TIMEOUT)
    assert await receive(slow) == diff({target.pk: online(text="one")})
    rounds = hub.delivery.rounds
    await set_status(tab, status="auto", text="two")
    # Its round is over: the diff waits behind the held send.
    assert await eventually(lambda: hub.delivery.rounds > rounds and not hub.delivery.in_flight)
    await slow.send_json_to({"type": "unsubscribe", "users": [str(target.pk)]})
    await set_status(tab, status="auto", text="three")
    assert await subscribe(slow, target) == state({target.pk: online(text="three")})
    drained.set()
    await assert_silent(slow)


def _dropping_announcements_of(user_id: Any, real: Callable[..., None]) -> Any:
    """Delivery.changed that loses the announcements of ``user_id`` (what a resync exists
    for), setting ``lost`` when one came."""
    lost = asyncio.Event()

    def changed(user_ids: Any, *args: Any, **kwargs: Any) -> None:
        user_ids = list(user_ids)
        if user_id in user_ids:
            lost.set()
            user_ids.remove(user_id)
        real(user_ids, *args, **kwargs)

    changed.lost = lost  # type: ignore[attr-defined]
    return changed


@pytest.fixture
def long_window(settings: Any) -> None:
    # A window long enough for the test to act while a delivery is due.
    settings.PRESENCE = {**BASE, "COALESCE_WINDOW": 1.0}


@pytest.mark.parametrize("first_still_watches", [False, True])
@pytest.mark.usefixtures("long_window")
async def test_a_resync_reaches_every_watcher_after_a_delivery_due_to_one_connection(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
    first_still_watches: bool,
) -> None:
    """A change during a connection's snapshot read is delivered to it again after the read,
    to it alone. That delivery must not take a resync (after an outage, a layer failure, lag)
    away from the user's other watchers: neither from one subscribed after the first
    connection unsubscribed, nor from one that watched all along."""
    first_user, other_user, target = [await new_user(make_user) for _ in range(3)]
    await lets_see(target, first_user, other_user)
    tab = await sockets.open(target)
    first = await sockets.open(first_user)
    other = await sockets.open(other_user)
    if first_still_watches:
        assert await subscribe(other, target) == state({target.pk: online()})
    hub = Hub.current()
    assert hub is not None
    snapshot, read, release = _held_once(lifecycle.asnapshot)
    monkeypatch.setattr(lifecycle, "asnapshot", snapshot)
    snapshot.hold.set()
    await first.send_json_to({"type": "subscribe", "users": [str(target.pk)]})
    await asyncio.wait_for(read.wait(), TIMEOUT)  # its snapshot is read, not sent yet
    await set_status(tab, status="auto", text="A")  # a change during the read
    assert await eventually(lambda: hub.delivery.after_snapshots)  # held for after the read
    release.set()
    assert (await receive(first))["type"] == "presence_state"
    # Due again, for the first connection alone.
    assert await eventually(lambda: target.pk in hub.delivery.only)
    if first_still_watches:
        assert await receive(other) == diff({target.pk: online(text="A")})
    else:
        await first.send_json_to({"type": "unsubscribe", "users": [str(target.pk)]})
        assert await subscribe(other, target) == state({target.pk: online(text="A")})
    changed = _dropping_announcements_of(target.pk, hub.delivery.changed)
    monkeypatch.setattr(hub.delivery, "changed", changed)
    await set_status(tab, status="auto", text="B")
    await asyncio.wait_for(changed.lost.wait(), TIMEOUT)
    hub.resync([target.pk])  # as Recovery does
    assert await receive(other) == diff({target.pk: online(text="B")})


async def test_a_fresh_stamp_waits_for_the_diffs_queued_before_it(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    settings: Any,
) -> None:
    """A fresh stamp claims that every change announced before it was sent: a diff still
    queued behind a held send (its round is over, nothing of it pending) holds it back, or
    the client could hold the stamp without the change, and a resume with it never gets it."""
    settings.PRESENCE = dict(fresh_stamps.SETTINGS)
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    tab = await sockets.open(target)
    held, drained = asyncio.Event(), asyncio.Event()
    slow = sockets.make(viewer, app=_app_holding_a_diff(held, drained))
    assert (await slow.connect(timeout=TIMEOUT))[0]
    await fresh_stamps.stamped_subscribe(slow, None, target)
    hub = Hub.current()
    assert hub is not None
    await set_status(tab, status="auto", text="one")
    await asyncio.wait_for(held.wait(), TIMEOUT)
    assert await receive(slow) == diff({target.pk: online(text="one")})
    rounds = hub.delivery.rounds
    await set_status(tab, status="auto", text="two")
    assert await eventually(lambda: hub.delivery.rounds > rounds and not hub.delivery.in_flight)
    clock.move_to(at(fresh_stamps.RESTAMP_AFTER + 10))
    await fresh_stamps.beat(slow)  # starts the proof
    proofs = hub.delivery.proofs
    assert await eventually(lambda: proofs and all(p.waiting is not None for p in proofs.values()))
    half_a_beat = fresh_stamps.SETTINGS["HEARTBEAT_INTERVAL"] / 2 + 1
    clock.shift(half_a_beat)
    await fresh_stamps.beat(slow)
    await assert_silent(slow)  # "two" is not out: no stamp
    drained.set()
    assert await receive(slow) == diff({target.pk: online(text="two")})
    clock.shift(half_a_beat)
    await fresh_stamps.beat(slow)
    assert (await receive(slow))["type"] == "stamp"


async def test_a_user_unsubscribed_during_a_read_redis_refused_is_not_tried_again(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    """Redis is unavailable to a round's read, during which the viewer unsubscribes: the
    user, watched by nobody here any more, is not queued for the retry. It was, and the retry's
    tick then recorded it as delivered for good (memory growing across outages)."""
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    await sockets.open(target)
    watching = await sockets.open(viewer)
    assert await subscribe(watching, target) == state({target.pk: online()})
    hub = Hub.current()
    assert hub is not None
    resolve, read, release = _held_once(lifecycle.apresence_for_viewers)
    monkeypatch.setattr(lifecycle, "apresence_for_viewers", resolve)
    resolve.hold.set()
    with unreachable_presence_redis(settings):
        await announce.aannounce([target.pk])
        await asyncio.wait_for(read.wait(), TIMEOUT)  # the read found Redis unavailable
        await watching.send_json_to({"type": "unsubscribe", "users": [str(target.pk)]})
        assert await eventually(lambda: target.pk not in hub.registry.watchers.members)
        release.set()
        assert await eventually(lambda: not hub.delivery.in_flight)
        assert target.pk not in hub.delivery.pending
        assert target.pk not in hub.delivery.delivered_at
        assert target.pk not in hub.delivery.changes
