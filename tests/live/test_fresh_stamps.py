"""Fresh stamps (docs/websocket.md, "Fresh stamps"): a connection whose client holds a stamp is
sent a fresh one once its own is two heartbeat intervals old (at most half of RESUME_WINDOW),
once the hub proved that every change announced before it was delivered; a page open longer
than RESUME_WINDOW then resumes with only what changed since, and any resume is not sent again
what it was sent before its last fresh stamp. The proof goes through the hub's own channel: a
change announced before it and not delivered yet holds the stamp back.

Helpers: tests/live/sockets.py. The clock stands still (the ``clock`` fixture) and is moved past
the windows; the hub's loops run on the real event loop clock.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels.testing import WebsocketCommunicator

from presence import announce, api, stamps
from presence.conf import STAMP_SLACK
from presence.hub import Hub
from presence.hub.hub import ordered
from presence.layer import CORE_LAYER
from presence.models import PrivacySettings
from tests.clock import T0, at
from tests.ids import wire_id
from tests.live.sockets import (
    BASE,
    Sockets,
    assert_silent,
    eventually,
    lets_see,
    new_user,
    receive,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets
from tools.redis_server import RedisServer

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]

#: long enough that nobody's online window runs out while a test moves the clock
SETTINGS = {**BASE, "ONLINE_WINDOW": 3600, "RESUME_WINDOW": 300, "HEARTBEAT_INTERVAL": 30}
#: two heartbeat intervals (under half of RESUME_WINDOW): when a fresh stamp is due
RESTAMP_AFTER = 60


@pytest.fixture(autouse=True)
def _fresh_stamp_settings(settings: Any, _base_settings: None) -> None:
    settings.PRESENCE = dict(SETTINGS)


async def people(make_user: Callable[..., Any], count: int = 3) -> tuple[Any, list[Any]]:
    """A viewer and ``count`` users who let the viewer see them (contacts), all offline."""
    viewer = await new_user(make_user)
    targets = [await new_user(make_user) for _ in range(count)]
    for target in targets:
        await lets_see(target, viewer)
    return viewer, targets


def ids(*users: Any) -> list[Any]:
    return [wire_id(user) for user in users]


async def stamped_subscribe(
    communicator: WebsocketCommunicator, since: Any, *users: Any
) -> dict[str, Any]:
    await communicator.send_json_to({"type": "subscribe", "users": ids(*users), "since": since})
    frame = await receive(communicator)
    assert frame["type"] == "presence_state"
    return frame


async def one_stamped_watch(
    sockets: Sockets, make_user: Callable[..., Any]
) -> tuple[Any, Any, WebsocketCommunicator, Hub]:
    """A viewer's socket subscribed with stamps to one user it may see: (the viewer, the
    user, the socket, the hub)."""
    viewer, (target,) = await people(make_user, 1)
    communicator = await sockets.open(viewer)
    await stamped_subscribe(communicator, None, target)
    hub = Hub.current()
    assert hub is not None
    return viewer, target, communicator, hub


async def beat(communicator: WebsocketCommunicator) -> None:
    await communicator.send_json_to({"type": "heartbeat", "state": "active"})


@sync_to_async
def resolved(viewer: Any, *targets: Any) -> dict[str, dict[str, Any]]:
    """What a full snapshot shows the viewer now (bulk_presence, the one resolver)."""
    found = api.bulk_presence([t.pk for t in targets], viewer)
    return {str(wire_id(pk)): p.as_dict() for pk, p in found.items()}


def probes_back(hub: Hub) -> Callable[[], bool]:
    """Every probe of the hub's connections is back (none is under way, or all are)."""
    return lambda: all(p.waiting is not None for p in hub.delivery.proofs.values())


async def fresh_stamp(
    communicator: WebsocketCommunicator, clock: time_machine.Coordinates, second: float = 0
) -> str:
    """At RESTAMP_AFTER (and a little; or at ``second``) the first heartbeat starts the proof,
    and sends nothing; half a heartbeat interval later the next one brings the stamp."""
    clock.move_to(at(second or RESTAMP_AFTER + 10))
    await beat(communicator)
    await assert_silent(communicator)
    hub = Hub.current()
    assert hub is not None
    assert await eventually(probes_back(hub))
    clock.shift(SETTINGS["HEARTBEAT_INTERVAL"] / 2 + 1)
    await beat(communicator)
    frame = await receive(communicator)
    assert frame["type"] == "stamp", frame
    assert hub.delivery.proofs == {}  # used once: deliveries note nothing more for it
    return str(frame["stamp"])


# --- resuming after RESUME_WINDOW -----------------------------------------------------------------


async def test_a_socket_open_past_the_window_with_a_fresh_stamp_resumes_with_only_changes(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, (early, late, away) = await people(make_user)
    communicator = await sockets.open(viewer)
    first = await stamped_subscribe(communicator, None, early, late, away)
    old_stamp = first["stamp"]

    # A change early in the page's life reaches it live.
    clock.move_to(at(100))
    await api.atouch(early)
    assert (await receive(communicator))["type"] == "presence_diff"

    stamp = await fresh_stamp(communicator, clock, 160)
    proven_at = stamps.accepted_time(stamp, viewer.pk)
    assert proven_at is not None and proven_at >= 100

    # Another change while open, then the socket drops, then a change while it is away.
    clock.move_to(at(390))
    await api.atouch(late)
    assert (await receive(communicator))["type"] == "presence_diff"
    clock.move_to(at(400))
    await sockets.close(communicator)
    clock.move_to(at(405))
    await api.atouch(away)
    clock.move_to(at(410))

    again = await sockets.open(viewer)
    answer = await stamped_subscribe(again, stamp, early, late, away)

    # Only what changed since the fresh stamp; merged with what the page shows, the truth.
    now = await resolved(viewer, early, late, away)
    assert set(answer["presences"]) == {str(wire_id(late)), str(wire_id(away))}
    assert answer["unchanged"] == ids(early)
    assert answer["presences"] == {key: now[key] for key in answer["presences"]}
    assert stamps.accepted_time(answer["stamp"], viewer.pk) is not None
    # The stamp of the first answer (410 s old) proves nothing: the full snapshot.
    assert stamps.accepted_time(old_stamp, viewer.pk) is None
    full = await stamped_subscribe(await sockets.open(viewer), old_stamp, early, late, away)
    assert full["presences"] == now and full["unchanged"] == []


async def test_a_privacy_change_after_the_fresh_stamp_shows_on_resuming(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, (hiding, other) = await people(make_user, 2)
    await api.atouch(hiding)
    communicator = await sockets.open(viewer)
    first = await stamped_subscribe(communicator, None, hiding, other)
    assert first["presences"][str(wire_id(hiding))]["status"] == "online"
    stamp = await fresh_stamp(communicator, clock, 160)
    clock.move_to(at(200))
    await sockets.close(communicator)

    # While the socket is away, the user hides from everyone.
    clock.move_to(at(210))
    await sync_to_async(PrivacySettings.objects.create)(
        user=hiding, online_visibility="nobody", last_seen_visibility="nobody"
    )
    clock.move_to(at(400))

    answer = await stamped_subscribe(await sockets.open(viewer), stamp, hiding, other)

    now = await resolved(viewer, hiding, other)
    assert answer["presences"] == {str(wire_id(hiding)): now[str(wire_id(hiding))]}
    assert now[str(wire_id(hiding))]["status"] == "offline"
    assert answer["unchanged"] == ids(other)


# --- the proof --------------------------------------------------------------------------------


async def test_a_change_announced_before_the_probe_holds_the_stamp_until_delivered(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    settings: Any,
) -> None:
    viewer, target, communicator, hub = await one_stamped_watch(sockets, make_user)
    # Deliveries wait (a long coalescing window): the change is announced, not delivered.
    settings.PRESENCE = {**SETTINGS, "COALESCE_WINDOW": 3600}
    clock.move_to(at(RESTAMP_AFTER + 10))
    await api.atouch(target)  # announced, and in the hub's channel before the probe
    await beat(communicator)  # the probe
    await assert_silent(communicator)
    assert await eventually(probes_back(hub))
    assert target.pk in hub.delivery.pending

    # Half a beat later the proof still waits for that delivery: no stamp.
    clock.shift(16)
    await beat(communicator)
    await assert_silent(communicator)

    # Delivered: the diff, then, at the next beat, the stamp (of the probe's time).
    hub.delivery.pending[target.pk] = 0.0
    hub.delivery._wake.set()
    diff = await receive(communicator)
    assert diff["type"] == "presence_diff"
    assert diff["presences"][str(wire_id(target))]["status"] == "online"
    clock.shift(16)
    await beat(communicator)
    frame = await receive(communicator)
    assert frame["type"] == "stamp"
    proven_at = stamps.accepted_time(frame["stamp"], viewer.pk)
    assert proven_at == RESTAMP_AFTER + 10 - STAMP_SLACK + T0.timestamp()


async def test_the_probe_comes_back_behind_the_announcements_sent_before_it(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _viewer, target, communicator, hub = await one_stamped_watch(sockets, make_user)
    # The hub's receive loop is slow: what reaches its channel is acted on later, in order.
    held: list[dict[str, Any]] = []
    real_dispatch = hub.dispatch
    monkeypatch.setattr(hub, "dispatch", held.append)
    clock.move_to(at(RESTAMP_AFTER + 10))
    await api.atouch(target)  # in the hub's channel, not acted on yet
    await beat(communicator)  # the probe, behind it
    assert await eventually(lambda: len(held) == 2)
    clock.shift(16)
    await beat(communicator)
    await assert_silent(communicator)  # the probe is not back: nothing is proven

    # The loop catches up (at the time the messages were sent: a late one would count as lag,
    # and a process behind its channel proves nothing until it has caught up).
    clock.move_to(at(RESTAMP_AFTER + 10))
    monkeypatch.setattr(hub, "dispatch", real_dispatch)
    for message in held:
        real_dispatch(message)
    assert (await receive(communicator))["type"] == "presence_diff"
    clock.shift(17)
    await beat(communicator)
    frame = await receive(communicator)
    assert frame["type"] == "stamp"


async def test_no_fresh_stamp_before_two_heartbeat_intervals_nor_without_stamps(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, (target,) = await people(make_user, 1)
    stamped = await sockets.open(viewer)
    await stamped_subscribe(stamped, None, target)
    plain = await sockets.open(viewer)  # a client that never asked for stamps
    await plain.send_json_to({"type": "subscribe", "users": ids(target)})
    assert (await receive(plain))["type"] == "presence_state"
    hub = Hub.current()
    assert hub is not None

    # A short page view: beats before two intervals bring nothing, and probe nothing.
    for second in range(30, RESTAMP_AFTER, 30):
        clock.move_to(at(second))
        await beat(stamped)
        await beat(plain)
    await assert_silent(stamped, plain)
    assert hub.delivery.proofs == {}

    # Long after: the stamped client gets a stamp, the other nothing.
    assert await fresh_stamp(stamped, clock)
    await beat(plain)
    clock.shift(400)
    await beat(plain)
    await assert_silent(plain)


async def test_a_fresh_stamp_is_sent_again_every_two_heartbeat_intervals(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, (target,) = await people(make_user, 1)
    communicator = await sockets.open(viewer)
    await stamped_subscribe(communicator, None, target)
    first = await fresh_stamp(communicator, clock)
    first_at = stamps.accepted_time(first, viewer.pk)
    assert first_at is not None

    # The next one two intervals after the first fresh stamp, not before.
    clock.move_to(at(first_at - T0.timestamp() + RESTAMP_AFTER - 5))
    await beat(communicator)
    await assert_silent(communicator)
    clock.shift(10)
    await beat(communicator)
    await assert_silent(communicator)
    hub = Hub.current()
    assert hub is not None
    assert await eventually(probes_back(hub))
    clock.shift(16)
    await beat(communicator)
    frame = await receive(communicator)
    assert frame["type"] == "stamp"
    second_at = stamps.accepted_time(frame["stamp"], viewer.pk)
    assert second_at is not None and second_at > first_at + RESTAMP_AFTER - 1


async def test_a_clock_stepped_back_does_not_put_off_the_fresh_stamp(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, _target, communicator, _hub = await one_stamped_watch(sockets, make_user)
    # The clock steps back an hour (NTP, a resumed VM) before the stamp is due: the wait is
    # taken as over, not stretched by the hour (the client's stamp would outgrow the window).
    stamp = await fresh_stamp(communicator, clock, second=-3600)
    assert stamps.accepted_time(stamp, viewer.pk) is not None


async def test_a_proof_begun_before_the_clock_stepped_back_is_begun_again(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, _target, communicator, hub = await one_stamped_watch(sockets, make_user)
    clock.move_to(at(RESTAMP_AFTER + 10))
    await beat(communicator)  # the proof begins
    await assert_silent(communicator)
    assert await eventually(probes_back(hub))
    # Stepped back an hour: a stamp of the proof's time would be from the future, which
    # proves nothing; a new proof is begun at once, and its stamp half a beat later.
    stamp = await fresh_stamp(communicator, clock, second=-3600)
    assert stamps.accepted_time(stamp, viewer.pk) is not None


async def test_only_first_in_first_out_layers_are_probed() -> None:
    layer = get_channel_layer()
    assert ordered(layer) == (
        type(layer).__name__ == "RedisChannelLayer" or len(getattr(layer, "_shards", ())) == 1
    )
    assert ordered(InMemoryChannelLayer())
    assert not ordered(object())


@pytest.mark.skipif(
    os.environ.get("PRESENCE_TEST_LAYER") != "pubsub",
    reason="the pub/sub layer may lose a message published before its subscription is in place",
)
async def test_a_probe_lost_on_the_pub_sub_layer_is_sent_again(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _viewer, _target, communicator, hub = await one_stamped_watch(sockets, make_user)
    # The first copy of the probe is lost (as one published before SUBSCRIBE took effect is).
    lost: list[dict[str, Any]] = []
    real_dispatch = hub.dispatch

    def lose_first_probe(message: dict[str, Any]) -> None:
        if message.get("type") == "presence.probe" and not lost:
            lost.append(message)
        else:
            real_dispatch(message)

    monkeypatch.setattr(hub, "dispatch", lose_first_probe)
    clock.move_to(at(RESTAMP_AFTER + 10))
    await beat(communicator)  # the probe
    assert await eventually(lambda: bool(lost))
    assert await eventually(probes_back(hub))  # its next copy is back
    clock.shift(16)
    await beat(communicator)
    frame = await receive(communicator)
    assert frame["type"] == "stamp"


@pytest.fixture
def layer_server(settings: Any) -> Iterator[RedisServer]:
    """A channel layer (the core one) on a Redis server of this test's own, which it may stop
    and start; set up before ``sockets``, so it outlives the hub's teardown."""
    with RedisServer() as server:
        settings.CHANNEL_LAYERS = {
            "default": {"BACKEND": CORE_LAYER, "CONFIG": {"hosts": [server.url]}}
        }
        yield server


async def test_the_probe_group_is_joined_again_after_the_layer_came_back_empty(
    layer_server: RedisServer,
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
) -> None:
    # The core layer's groups are keys on its server: one restarted empty has lost the hub's
    # probe group, and a probe sent to it never comes back (no fresh stamp again until the
    # group's renewal, half the layer's group expiry later). A failed layer call is how a
    # process learns that its server may have come back empty.
    viewer, (target,) = await people(make_user, 1)
    communicator = await sockets.open(viewer)
    await stamped_subscribe(communicator, None, target)
    first = await fresh_stamp(communicator, clock)

    layer_server.stop()
    failures = announce.layer_failures
    await announce.aannounce([target.pk])  # refused: the layer's server is down
    assert announce.layer_failures > failures
    layer_server.start()  # back, and empty

    first_at = stamps.accepted_time(first, viewer.pk)
    assert first_at is not None
    second = await fresh_stamp(communicator, clock, first_at - T0.timestamp() + 70)
    assert (stamps.accepted_time(second, viewer.pk) or 0) > first_at


# --- every connection, changes or not -------------------------------------------------------------


async def test_a_resume_is_not_sent_what_came_before_the_fresh_stamp(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    """A reconnect resumes from its stamp: one that lagged what the client was sent had it
    sent all that again (a server restart's storm). Every stamped connection gets a fresh
    stamp two heartbeat intervals after its stamp, whether its users changed or not (when it
    goes out tells the viewer nothing)."""
    viewer, (target, other) = await people(make_user, 2)
    changed = await sockets.open(viewer)
    first = await stamped_subscribe(changed, None, target)
    quiet = await sockets.open(viewer)
    await stamped_subscribe(quiet, None, other)
    hub = Hub.current()
    assert hub is not None

    clock.move_to(at(10))
    await api.atouch(target)
    assert (await receive(changed))["type"] == "presence_diff"
    clock.move_to(at(50))
    await beat(changed)
    await beat(quiet)
    await assert_silent(changed, quiet)
    assert hub.delivery.proofs == {}
    # Past two intervals: the first beat starts the proof, one half an interval later sends it.
    clock.move_to(at(65))
    await beat(changed)
    await beat(quiet)
    await assert_silent(changed, quiet)
    assert await eventually(probes_back(hub))
    clock.shift(SETTINGS["HEARTBEAT_INTERVAL"] / 2 + 1)
    fresh = {}
    for communicator in (changed, quiet):
        await beat(communicator)
        frame = await receive(communicator)
        assert frame["type"] == "stamp", frame
        fresh[communicator] = frame["stamp"]
        fresh_at = stamps.accepted_time(frame["stamp"], viewer.pk)
        assert fresh_at is not None and fresh_at >= T0.timestamp() + 60

    # The resume from the fresh stamp is not sent the diff again; from the first answer's it is.
    clock.move_to(at(100))
    answer = await stamped_subscribe(await sockets.open(viewer), fresh[changed], target)
    assert answer["presences"] == {} and answer["unchanged"] == ids(target)
    again = await stamped_subscribe(await sockets.open(viewer), first["stamp"], target)
    assert set(again["presences"]) == {str(wire_id(target))} and again["unchanged"] == []


async def test_connections_probing_at_one_moment_share_one_probe(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One channel-layer message proves the fresh stamps of the connections whose heartbeats
    come within a second (a storm's thousands), each claiming the probe's time."""
    viewer, targets = await people(make_user, 3)
    communicators = []
    for target in targets:
        communicator = await sockets.open(viewer)
        await stamped_subscribe(communicator, None, target)
        communicators.append(communicator)
    hub = Hub.current()
    assert hub is not None
    probes: list[dict[str, Any]] = []
    real_dispatch = hub.dispatch

    def count_probes(message: dict[str, Any]) -> None:
        if message.get("type") == "presence.probe":
            probes.append(message)
        real_dispatch(message)

    monkeypatch.setattr(hub, "dispatch", count_probes)
    clock.move_to(at(RESTAMP_AFTER + 10))
    for communicator in communicators:
        await beat(communicator)
    await assert_silent(*communicators)
    assert await eventually(probes_back(hub))
    clock.shift(SETTINGS["HEARTBEAT_INTERVAL"] / 2 + 1)
    claims = set()
    for communicator in communicators:
        await beat(communicator)
        frame = await receive(communicator)
        assert frame["type"] == "stamp", frame
        claims.add(stamps.accepted_time(frame["stamp"], viewer.pk))
    assert len({p["probe"] for p in probes}) == 1
    assert len(claims) == 1 and None not in claims
