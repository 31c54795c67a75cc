"""presence.lifecycle: connections, announcements, the sweep, and the fan-out's reads
(presence_for_viewers), against the real Redis and channel layer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
import time_machine
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings

from presence import announce, api, lifecycle
from presence.conf import get_settings
from presence.domain import Device, LiveState, Presence, Status
from presence.models import Block, Contact, LastSeen, PrivacySettings, UserStatus
from presence.store import PresenceStore, get_store
from presence.store.cluster import ClusterRunner
from presence.users import decode_id
from tests.clock import T0, at
from tests.core.test_api import DOWN, UNKNOWN_ID
from tests.ids import redis_member
from tests.privacy_cases import (
    CUSTOM,
    NOW,
    count_round_trips,
)

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.uuid_site,
    pytest.mark.cluster,
]


# --- the live layer: connections, announcements, the sweep, the fan-out's reads -----------------

#: the clock fixture's start, in epoch seconds; and the default timings
T = T0.timestamp()
TTL, GRACE, WINDOW = 90, 5, 300
#: a heartbeat's TTL and a close's grace count from the end of the second the store keeps
TTL_END, GRACE_END = TTL + 1, GRACE + 1
#: how long reading an announcement that is in Redis may take on a busy machine
RECEIVE_TIMEOUT = 10


class Announcements:
    """A channel of the real channel layer in the groups of some users: what presence announced
    about them (announce.aannounce group_sends ``presence.changed`` to each user's group)."""

    def __init__(self) -> None:
        self.layer: Any = get_channel_layer()
        self.channel = ""

    async def watch(self, *users: Any) -> None:
        if not self.channel:
            self.channel = await self.layer.new_channel()
        for user in users:
            await self.layer.group_add(announce.group_name(user.pk), self.channel)

    async def received(self, quiet: float = 0.2) -> list[Any]:
        """The users announced since the last call, sorted.

        An announcement is in Redis when the call that made it returns: every message waiting
        in the channel's queue is read, each receive awaited to its end (a receive cancelled by
        a timeout after Redis handed it a message loses that message, and on a busy machine a
        message already there may take longer than ``quiet`` to come through). Then the queue is
        watched for ``quiet`` seconds more, for an announcement made later."""
        users: list[Any] = []
        loop = asyncio.get_running_loop()
        quiet_until = loop.time() + quiet
        while True:
            if await self._waiting():
                # Bounds a read of a message that is in Redis: it must arrive.
                message = await asyncio.wait_for(self.layer.receive(self.channel), RECEIVE_TIMEOUT)
                assert message["type"] == announce.CHANGED
                users += map(decode_id, message["users"])  # ids in their canonical form
                quiet_until = loop.time() + quiet
            elif loop.time() >= quiet_until:
                return sorted(users)
            else:
                await asyncio.sleep(0.01)

    async def _waiting(self) -> int:
        """Messages in Redis for this process's channels (the core layer keeps them in one
        sorted set; this test process has no other channel)."""
        real = self.layer.non_local_name(self.channel)
        connection = self.layer.connection(self.layer.consistent_hash(real))
        return int(await connection.zcard(self.layer.prefix + real))


async def last_seen(user: Any) -> datetime | None:
    row = await LastSeen.objects.filter(user=user).afirst()
    return row.seen_at if row else None


async def state_of(user: Any) -> LiveState:
    states = await get_store().arun(get_store().plans.read([user.pk]))
    assert states is not None
    return states.get(user.pk, LiveState())


def expiring_at(redis_client: redis.Redis, user: Any) -> Any:
    return redis_client.zscore(get_store().keys.user_expiring_key(user.pk), redis_member(user))


def due_at(redis_client: redis.Redis, user: Any) -> float | None:
    return redis_client.zscore(get_store().keys.user_due_key(user.pk), redis_member(user))


live_db = pytest.mark.django_db(transaction=True)


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_heartbeats_and_disconnects_announce_only_news(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    try:
        first = await lifecycle.aheartbeat(user, "c1")
        assert first is not None
        assert first.after == LiveState(last_active=T, devices=(Device.WEB,), connected=True)
        assert await news.received() == [user.pk]  # came online
        clock.shift(30)
        await lifecycle.aheartbeat(user, "c1")
        assert await news.received() == []  # only time moved
        await lifecycle.aheartbeat(user, "c2", "mobile")
        assert await news.received() == [user.pk]  # one device more
        await lifecycle.aheartbeat(user.pk, "c2", "mobile")
        await lifecycle.aheartbeat(user, "c1", idle=True)  # c2 is still in use
        assert await news.received() == []
        await lifecycle.aheartbeat(user, "c2", "mobile", idle=True)
        assert await news.received() == [user.pk]  # idle now
        one_left = await lifecycle.adisconnect(user, "c2")
        assert one_left is not None and one_left.connections == 1
        assert await news.received() == [user.pk]  # the mobile device left
        assert await last_seen(user) is None
        none_left = await lifecycle.adisconnect(user, "c1")
        assert none_left is not None and none_left.connections == 0
        assert none_left.after == LiveState(
            last_active=T + 30, devices=(Device.WEB,), signed_off=True, idle=True
        )
        assert await news.received() == []  # within the grace: a reload must not flap
        # Last seen is in Redis; the database is written once the user is offline (the sweep).
        assert await last_seen(user) is None
        # Friends see the user idle until the grace ends.
        assert (await api.aget_presence(user, user)).status is Status.IDLE
    finally:
        await get_store().aclose()


async def active_again_unannounced(user: Any, news: Announcements) -> None:
    """The user's page "c1" comes online idle, then turns active: recorded in Redis by a process
    killed before it could announce it (viewers still see "idle")."""
    await lifecycle.aconnect(user, "c1")
    await lifecycle.aheartbeat(user, "c1", idle=True)
    assert await news.received() == [user.pk, user.pk]  # (came online, then idle)
    store = get_store()
    written = await store.arun(
        store.plans.connection(user.pk, "beat", lifecycle.resolution.now(), "c1")
    )
    assert written is not None and not written.crashed
    assert await news.received() == []


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_a_change_never_announced_is_announced_when_its_connection_is_found_crashed(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    try:
        await active_again_unannounced(user, news)
        clock.shift(5)
        # The page reconnects to another server, active: no change from what Redis holds.
        reconnected = await lifecycle.aconnect(user, "c2")
        assert reconnected is not None and reconnected.crashed == 0
        assert await news.received() == []
        clock.move_to(at(5 + TTL_END - 1))
        # The dead server's connection is found crashed at the first write after its TTL.
        beat = await lifecycle.aheartbeat(user, "c2")
        assert beat is not None and (beat.crashed, beat.unsettled) == (1, 1)
        # Nothing visible changed in Redis: online, active, on the web, before and after...
        for state in (beat.before, beat.after):
            assert (state.connected, state.idle, state.devices) == (True, False, (Device.WEB,))
        assert await news.received() == [user.pk]  # ...but viewers may never have been told
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_the_sweep_announces_users_still_online_who_lost_a_crashed_connection(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    try:
        await active_again_unannounced(user, news)
        clock.move_to(at(TTL - 2))
        await lifecycle.aconnect(user, "c2")  # c1 still counts: nothing visible changes
        await lifecycle.aconnect(user, "c3")
        clock.shift(1)
        await lifecycle.adisconnect(user, "c3")  # due at the end of its grace
        assert await news.received() == []
        assert due_at(redis_client, user) == T + TTL - 1 + GRACE_END
        clock.move_to(at(TTL - 1 + GRACE_END))
        report = await lifecycle.asweep()
        # c1 went (crashed); c2 is alive: the user stays online, and is announced.
        assert report == lifecycle.SweepReport(offline=[], rescheduled=1, changed=[user.pk])
        assert await news.received() == [user.pk]
        left = get_store().run(get_store().plans.describe_connections(user.pk))
        assert [entry.split(":")[0] for entry in left] == ["c2"]
    finally:
        await get_store().aclose()


def change_stamp(redis_client: redis.Redis, user: Any) -> float | None:
    """When the user's visible presence last changed, as pages and resuming sockets read it."""
    keys = get_store().keys
    key = keys.changes_key(keys.shard_of(keys.bucket_of(user.pk)))
    return redis_client.zscore(key, redis_member(user))


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_dropping_a_crashed_connection_whose_last_write_was_no_news_announces_nothing(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    # A reconnect storm: the server holding c1 was killed long after its last change was
    # announced (its last write, a heartbeat, changed nothing); the page goes on over c2.
    # Dropping c1 changes nothing anyone sees: no announcement, no change stamp.
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    try:
        await lifecycle.aconnect(user, "c1")
        assert await news.received() == [user.pk]
        clock.shift(30)
        await lifecycle.aheartbeat(user, "c1")  # its last write: no news
        clock.shift(5)
        await lifecycle.aconnect(user, "c2")
        assert await news.received() == []
        stamped = change_stamp(redis_client, user)
        assert stamped is not None  # c1's open
        clock.move_to(at(30 + TTL_END))
        beat = await lifecycle.aheartbeat(user, "c2")
        assert beat is not None and (beat.crashed, beat.unsettled) == (1, 0)
        assert await news.received() == []
        assert change_stamp(redis_client, user) == stamped
        left = get_store().run(get_store().plans.describe_connections(user.pk))
        assert [entry.split(":")[0] for entry in left] == ["c2"]
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_a_crashed_connection_written_while_an_announcement_was_retried_is_announced(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # c1's process was still retrying an announcement of the user's (the layer down) when it
    # wrote c1's last heartbeat, and died: that announcement may never have gone out.
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    try:
        await lifecycle.aconnect(user, "c1")
        assert await news.received() == [user.pk]
        clock.shift(30)
        store = get_store()
        quiet_at = lifecycle.resolution.now()
        # no news, nothing pending: settled
        quiet = await store.arun(store.plans.connection(user.pk, "beat", quiet_at, "c1"))
        assert quiet is not None and not lifecycle.resolution.is_news(quiet, quiet_at)
        plan = store.plans.connection(
            user.pk, "beat", lifecycle.resolution.now(), "c1", retrying=True
        )
        assert await store.arun(plan) is not None
        clock.shift(5)
        await lifecycle.aconnect(user, "c2")
        assert await news.received() == []
        clock.move_to(at(30 + TTL_END))
        beat = await lifecycle.aheartbeat(user, "c2")
        assert beat is not None and (beat.crashed, beat.unsettled) == (1, 1)
        assert await news.received() == [user.pk]
    finally:
        await get_store().aclose()


def slow_round_trips(
    monkeypatch: pytest.MonkeyPatch, clock: time_machine.Coordinates, seconds: float
) -> None:
    """From now on each of the store's round trips answers ``seconds`` after Redis ran it, on
    the test's clock (a busy machine, a slow network)."""
    store = get_store()
    real = store.arun

    async def arun(*args: Any, **kwargs: Any) -> Any:
        result = await real(*args, **kwargs)
        clock.shift(seconds)
        return result

    monkeypatch.setattr(store, "arun", arun)


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_a_heartbeat_answered_after_the_ttl_ran_out_is_announced(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader that read the user while the heartbeat was under way saw them offline (their
    # connection's TTL had run out); nothing else would tell it they are back.
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    try:
        await lifecycle.aheartbeat(user, "c1")
        assert await news.received() == [user.pk]
        clock.move_to(at(TTL_END - 0.1))
        await lifecycle.aheartbeat(user, "c1")  # answered in time
        assert await news.received() == []
        clock.move_to(at(TTL + TTL_END - 0.1))  # (the last one is kept as second T + TTL)
        slow_round_trips(monkeypatch, clock, 0.2)
        await lifecycle.aheartbeat(user, "c1")
        assert await news.received() == [user.pk]
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
@pytest.mark.parametrize("reader", ["snapshot", "fan-out", "bulk_presence"])
async def test_a_read_answered_after_the_ttl_ran_out_shows_the_state_it_read(
    reader: str,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Judged when its answer came, the user would be offline, and a heartbeat landing
    # meanwhile (answered before the TTL ran out: no news) would never correct it.
    user = await sync_to_async(make_user)()
    try:
        await lifecycle.aheartbeat(user, "c1")
        clock.move_to(at(TTL_END - 0.1))
        slow_round_trips(monkeypatch, clock, 0.2)
        if reader == "snapshot":
            presences, guessed = await lifecycle.asnapshot([user.pk], user)
            assert guessed is False
            presence = presences[user.pk]
        elif reader == "fan-out":
            resolved = await lifecycle.apresence_for_viewers({user.pk: [user.pk]})
            assert resolved is not None
            presence = resolved[user.pk][user.pk]
        else:
            presence = (await api.abulk_presence([user], user))[user.pk]
        assert presence.status is Status.ONLINE
        assert presence.devices == ("web",)
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_sweep_announces_the_end_of_the_grace(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    try:
        await lifecycle.aheartbeat(user, "c1")
        clock.shift(10)
        await lifecycle.adisconnect(user, "c1")
        assert await news.received() == [user.pk]  # (came online)
        assert due_at(redis_client, user) == T + 10 + GRACE_END

        clock.shift(GRACE)
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[])
        assert await news.received() == []
        assert await last_seen(user) is None  # still online to others: nothing persisted
        clock.shift(1)
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[user.pk])
        assert await news.received() == [user.pk]
        assert (await api.aget_presence(user, user)).status is Status.OFFLINE
        # Offline now: the close's moment is persisted, by the sweep that announced it.
        assert await last_seen(user) == at(10)
        assert due_at(redis_client, user) is None
        # Claimed once: the next sweep has nothing to do.
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[])
        assert await news.received() == []
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
@pytest.mark.parametrize("closed_at", [10.0, 10.5, 10.9])
async def test_the_sweep_waits_the_full_grace_after_a_close(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
    closed_at: float,
) -> None:
    # The store keeps the close's second only; friends must still get the whole grace, counted
    # from the close itself, and hear of the end within a second after it.
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    try:
        await lifecycle.aheartbeat(user, "c1")
        clock.move_to(at(closed_at))
        await lifecycle.adisconnect(user, "c1")
        assert await news.received() == [user.pk]  # (came online)
        clock.move_to(at(closed_at + GRACE - 0.01))
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[])
        assert await news.received() == []
        assert (await api.aget_presence(user, user)).status is Status.ONLINE
        clock.move_to(at(closed_at + GRACE + 1))
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[user.pk])
        assert await news.received() == [user.pk]
        assert (await api.aget_presence(user, user)).status is Status.OFFLINE
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
@pytest.mark.parametrize("beat_at", [60.0, 60.5, 60.9])
async def test_the_sweep_waits_the_full_ttl_after_a_heartbeat(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
    beat_at: float,
) -> None:
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    try:
        await lifecycle.aheartbeat(user, "c1")
        assert await news.received() == [user.pk]  # (came online)
        clock.move_to(at(beat_at))
        await lifecycle.aheartbeat(user, "c1")  # its last heartbeat
        clock.move_to(at(beat_at + TTL - 0.01))
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[], rescheduled=0)
        assert await news.received() == []
        assert (await api.aget_presence(user, user)).status is Status.ONLINE
        assert len(get_store().run(get_store().plans.describe_connections(user.pk))) == 1
        clock.move_to(at(beat_at + TTL + 1))
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[user.pk])
        assert await news.received() == [user.pk]
        assert await last_seen(user) == at(int(beat_at))  # the store's second of the heartbeat
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_sweep_finds_crashed_connections_at_their_ttl(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    crashed, fine = await sync_to_async(make_user)(), await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(crashed, fine)
    try:
        await lifecycle.aheartbeat(crashed, "c1", "desktop")
        await lifecycle.aheartbeat(fine, "c9")
        # (read before the clock moves a minute on: channels_redis drops older messages)
        assert await news.received() == sorted([crashed.pk, fine.pk])
        clock.shift(60)
        await lifecycle.aheartbeat(crashed, "c1", "desktop")  # its last heartbeat
        await lifecycle.aheartbeat(fine, "c9")
        clock.shift(60)
        await lifecycle.aheartbeat(fine, "c9")
        assert await news.received() == []
        clock.move_to(at(60 + TTL))
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[])
        clock.shift(1.4)  # in the second after CONNECTION_TTL after the heartbeat's second
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[crashed.pk])
        assert await news.received() == [crashed.pk]
        # Signed off at its last heartbeat, which is persisted as last seen.
        assert await state_of(crashed) == LiveState(
            last_active=T + 60, devices=(Device.DESKTOP,), signed_off=True
        )
        assert await last_seen(crashed) == at(60)
        assert get_store().run(get_store().plans.describe_connections(crashed.pk)) == []
        # The other user's connection is untouched.
        assert await state_of(fine) == LiveState(
            last_active=T + 120, devices=(Device.WEB,), connected=True
        )
        assert await last_seen(fine) is None
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_sweep_reschedules_users_still_online(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    try:
        await lifecycle.aheartbeat(user, "c1")
        await lifecycle.aheartbeat(user, "c2")
        clock.shift(10)
        await lifecycle.adisconnect(user, "c2")  # one tab of two closed: due at the grace's end
        assert await news.received() == [user.pk]  # (came online)
        clock.shift(GRACE_END)
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[], rescheduled=1)
        assert await news.received() == []
        # Checked again when the remaining connection's TTL ends.
        assert due_at(redis_client, user) == T + TTL + 1
        clock.move_to(at(TTL + 1))
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[user.pk])
        assert await news.received() == [user.pk]
        assert await last_seen(user) == T0  # crashed: last seen at its last heartbeat
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_sweep_after_logout_with_a_live_connection(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    user = await sync_to_async(make_user)()
    try:
        await lifecycle.aheartbeat(user, "c1")
        clock.shift(10)
        await api.asign_off(user)  # the WebSocket of another tab is still open
        assert await last_seen(user) == at(10)
        clock.shift(GRACE_END)
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[], rescheduled=1)
        assert (await api.aget_presence(user, user)).status is Status.ONLINE
        # The logout was the last activity; the connection keeps the user on for its TTL.
        assert due_at(redis_client, user) == T + 10 + TTL + 1
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_sweep_of_users_seen_by_http_only(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    try:
        await api.atouch(user)
        assert await news.received() == [user.pk]  # came online
        clock.shift(100)
        await api.atouch(user)
        assert await news.received() == []
        assert due_at(redis_client, user) == T + WINDOW  # the earlier time is kept
        clock.move_to(at(WINDOW))
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[], rescheduled=1)
        # Page views' window counts from the start of their second: due at its end, no later.
        assert due_at(redis_client, user) == T + 100 + WINDOW
        clock.move_to(at(100 + WINDOW))
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[user.pk])
        assert await news.received() == [user.pk]
        assert await last_seen(user) is None  # presence_cleanup persists these
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_sweep_announces_expired_custom_statuses(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    user, other = await sync_to_async(make_user)(), await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user, other)
    try:
        await api.aset_status(user, "dnd", text="Lunch", expires_at=at(60))
        await api.aset_status(other, "auto", text="Away", expires_at=at(3600))
        assert set(await news.received()) == {user.pk, other.pk}  # (the changes themselves)
        assert (
            redis_client.zscore(get_store().keys.user_expiring_key(user.pk), redis_member(user))
            == T + 61
        )
        clock.shift(60)
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[])
        clock.shift(1)
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[], expired_statuses=1)
        assert await news.received() == [user.pk]
        assert (await api.aget_presence(user, user)).text is None
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[])
        assert await news.received() == []
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_sweep_during_an_outage_loses_nobody(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    user = await sync_to_async(make_user)()
    try:
        await lifecycle.aheartbeat(user, "c1")
        await api.aset_status(user, "auto", text="Back soon", expires_at=at(30))
        clock.shift(TTL_END)
        await get_store().aclose()
        with override_settings(CACHES=DOWN):
            assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[])
        # Nothing was claimed: both schedules are intact.
        assert due_at(redis_client, user) == T + TTL_END
        assert (
            redis_client.zscore(get_store().keys.user_expiring_key(user.pk), redis_member(user))
            == T + 31
        )
        assert await lifecycle.asweep() == lifecycle.SweepReport(
            offline=[user.pk], expired_statuses=1
        )
        assert await last_seen(user) == T0
    finally:
        await get_store().aclose()


@live_db
@pytest.mark.usefixtures("close_async_db_connections")
async def test_redis_failing_after_the_claim_loses_nobody(
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The claim takes the users out of the schedule; if Redis fails right after (the expiry
    # check), they must still be checked once Redis answers again.
    user = await sync_to_async(make_user)()
    news = Announcements()
    await news.watch(user)
    round_trips: list[Any] = []
    if get_store().cluster is None:
        original = PresenceStore._aexecute

        async def flaky(self: Any, client: Any, commands: Any) -> list[Any]:
            round_trips.append(commands)
            if len(round_trips) == 2:
                raise redis.ConnectionError("Connection reset by peer")
            return await original(self, client, commands)

        patched: Any = PresenceStore
    else:  # the cluster run: every master fails at once
        original_cluster = ClusterRunner.aexecute

        async def flaky(self: Any, commands: Any, *args: Any) -> list[Any]:  # type: ignore[misc]
            round_trips.append(commands)
            if len(round_trips) == 2:
                raise redis.ConnectionError("Connection reset by peer")
            return await original_cluster(self, commands, *args)

        patched = ClusterRunner

    try:
        await lifecycle.aheartbeat(user, "c1")
        assert await news.received() == [user.pk]
        clock.shift(TTL_END)
        monkeypatch.setattr(patched, "_aexecute" if patched is PresenceStore else "aexecute", flaky)
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[], rescheduled=1)
        assert len(round_trips) == 2  # the claim, the failed check; then Redis is left alone
        assert await news.received() == []
        clock.shift(get_settings().RETRY_INTERVAL)
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[user.pk])
        assert await news.received() == [user.pk]
        assert await last_seen(user) == T0
        assert await lifecycle.asweep() == lifecycle.SweepReport(offline=[])
    finally:
        await get_store().aclose()


def _viewers_graph(make_user: Callable[..., Any]) -> tuple[list[Any], list[Any]]:
    target, hidden, quiet = make_user(), make_user(), make_user()
    contact, close, stranger, blocked, blocking = (make_user() for _ in range(5))
    for owner in (target, hidden, quiet):
        Contact.objects.create(owner=owner, contact=contact)
        Contact.objects.create(owner=owner, contact=close, close_friend=True)
        Contact.objects.create(owner=owner, contact=blocked, close_friend=True)
        Contact.objects.create(owner=owner, contact=blocking, close_friend=True)
        Block.objects.create(blocker=owner, blocked=blocked)
        Block.objects.create(blocker=blocking, blocked=owner)
    PrivacySettings.objects.create(
        user=target, last_seen_visibility="close_friends", activity_visibility="everyone"
    )
    UserStatus.objects.create(user=target, dnd=True, **CUSTOM)
    PrivacySettings.objects.create(user=hidden, online_visibility="everyone", invisible=True)
    LastSeen.objects.create(user=quiet, seen_at=NOW - timedelta(days=2))
    return [target, hidden, quiet], [target, contact, close, stranger, blocked, blocking]


def test_presence_for_viewers_is_what_each_viewer_may_see(
    make_user: Callable[..., Any],
) -> None:
    targets, viewers = _viewers_graph(make_user)
    target, hidden, quiet = targets
    _, contact, close, stranger, blocked, blocking = viewers
    with time_machine.travel(NOW, tick=False):
        store = get_store()
        store.run(store.plans.connection(target.pk, "beat", NOW.timestamp(), "c1", idle=True))
        store.run(store.plans.connection(hidden.pk, "beat", NOW.timestamp(), "c1", Device.MOBILE))
        watchers = {t.pk: {v.pk for v in viewers} for t in targets} | {UNKNOWN_ID: {contact.pk}}

        async def read() -> dict[int, dict[int, Presence]] | None:
            try:
                await get_store().async_client.ping()  # connect outside the measured part
                with count_round_trips() as trips:
                    result = await lifecycle.apresence_for_viewers(watchers)
                assert trips.count == 1
                return result
            finally:
                await get_store().aclose()

        with CaptureQueriesContext(connection) as queries:
            result = async_to_sync(read)()
        assert len(queries) == 3  # whatever the number of viewers
        assert result is not None
        assert set(result) == {t.pk for t in targets}  # the id of no user is left out
        for t in targets:
            assert set(result[t.pk]) == {v.pk for v in viewers}
            for v in viewers:
                # The one resolver: exactly what bulk_presence shows this viewer.
                assert result[t.pk][v.pk] == api.bulk_presence([t], v)[t.pk], (t, v)

    # Spot checks from the rules themselves (the target is idle, with dnd chosen: dnd wins).
    recently = None  # a hidden last seen of today shows not even the day (none before known)
    assert result[target.pk][contact.pk] == Presence(
        status=Status.DND, devices=("web",), **CUSTOM, last_seen_approx=recently
    )  # last seen only for close friends
    assert result[target.pk][close.pk] == Presence(
        status=Status.DND, last_seen=NOW, devices=("web",), **CUSTOM
    )
    # Activity is for everyone.
    assert result[target.pk][stranger.pk] == Presence(**CUSTOM, last_seen_approx=recently)
    assert result[target.pk][blocked.pk] == Presence()
    assert result[target.pk][blocking.pk] == Presence()
    assert result[target.pk][target.pk] == Presence(
        status=Status.DND, last_seen=NOW, devices=("web",), invisible=False, **CUSTOM
    )
    assert result[hidden.pk][close.pk] == Presence(last_seen_approx=recently)  # invisible
    assert result[quiet.pk][contact.pk] == Presence(last_seen=NOW - timedelta(days=2))


def test_presence_for_viewers_while_redis_is_down(make_user: Callable[..., Any]) -> None:
    target, viewer = make_user(), make_user()
    with override_settings(CACHES=DOWN):
        # Nothing is guessed: the outage is found (the database was read meanwhile)...
        assert async_to_sync(lifecycle.apresence_for_viewers)({target.pk: {viewer.pk}}) is None
        # ... and while it is known, the hub's retries do not read the database for nothing.
        with CaptureQueriesContext(connection) as queries:
            assert async_to_sync(lifecycle.apresence_for_viewers)({target.pk: {viewer.pk}}) is None
    assert len(queries) == 0


def test_presence_for_viewers_of_nobody(make_user: Callable[..., Any]) -> None:
    async def read() -> dict[int, dict[int, Presence]] | None:
        try:
            return await lifecycle.apresence_for_viewers({})
        finally:
            await get_store().aclose()

    with CaptureQueriesContext(connection) as queries:
        assert async_to_sync(read)() == {}
    assert len(queries) == 0


@live_db  # (Redis's copy of the choices is written once the change is committed)
def test_set_status_schedules_the_expiry_announcement(
    make_user: Callable[..., Any], redis_client: redis.Redis
) -> None:
    user = make_user()
    expiring = get_store().keys.user_expiring_key(user.pk)
    with time_machine.travel(NOW, tick=False):
        api.set_status(user, "auto", text="Lunch", expires_at=NOW + timedelta(minutes=30))
        assert redis_client.zscore(expiring, redis_member(user)) == NOW.timestamp() + 1800 + 1
        api.set_status(user, "dnd", emoji="🍜", expires_at=NOW + timedelta(minutes=10))
        assert redis_client.zscore(expiring, redis_member(user)) == NOW.timestamp() + 600 + 1
        api.set_status(user, "dnd", emoji="🍜")  # no expiry any more
        assert redis_client.zscore(expiring, redis_member(user)) is None
        api.set_status(user, "auto", expires_at=NOW + timedelta(minutes=10))
        # Nothing custom to clear: nothing to announce.
        assert redis_client.zscore(expiring, redis_member(user)) is None


@override_settings(PRESENCE={"MAX_FRAME_BYTES": 4096, "MAX_SUBSCRIPTIONS": 50})
def test_limits_come_from_settings() -> None:
    limits = lifecycle.limits()
    assert (limits.max_frame_bytes, limits.max_subscriptions) == (4096, 50)
    assert (limits.text_max_length, limits.emoji_max_length, limits.max_expiry) == (
        140,
        16,
        30 * 24 * 3600,
    )
