"""Presence on a real Redis Cluster (tools/redis_cluster.py) while things happen to it: the
spread over masters, one round trip per master, a master stopped and restarted empty, scripts
flushed, slots resharded under writes, a replica promoted.

Each test's cluster runs on loopback and is stopped by pid afterwards, also when a test fails.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.core.management import CommandError, call_command
from django.test import Client
from redis.crc import key_slot

from presence import api, domain
from presence.conf import PresenceSettings, get_settings
from presence.domain import Device, Status
from presence.models import LastSeen
from presence.rooms import writes
from presence.routing import websocket_urlpatterns
from presence.store import PresenceStore, get_store, merge
from tests.store.test_store import written_then_read
from tools.redis_cluster import RedisCluster

NOW = 1_800_000_000
USERS = range(1, 3001)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(masters=3) as running:
        yield running


@pytest.fixture
def store(cluster: RedisCluster) -> Iterator[PresenceStore]:
    for port in cluster.master_ports():
        client = redis.Redis(port=port)
        client.flushall()
        client.close()
    conf = PresenceSettings(REDIS_CLUSTER=tuple(cluster.urls), RETRY_INTERVAL=0.2)
    built = PresenceStore(conf)
    yield built
    built.close()


def master_of(cluster: RedisCluster, key: str) -> int:
    """The port of the master holding ``key``'s slot, from CLUSTER SLOTS."""
    client = redis.Redis(port=cluster.master_ports()[0])
    try:
        slot = key_slot(key.encode())
        for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                return int(master[1])
    finally:
        client.close()
    raise AssertionError(f"slot of {key} not served")


def touch_all(store: PresenceStore, users: range, at: int = NOW) -> None:
    for start in range(0, len(users), 500):
        chunk = users[start : start + 500]
        store.run(merge([store.plans.touch(u, Device.WEB, at) for u in chunk]))


def test_keys_and_commands_spread_evenly_over_the_masters(
    cluster: RedisCluster, store: PresenceStore
) -> None:
    before = {port: _calls(port) for port in cluster.master_ports()}
    touch_all(store, USERS)
    keys = {port: redis.Redis(port=port).dbsize() for port in cluster.master_ports()}
    calls = {port: _calls(port) - before[port] for port in cluster.master_ports()}
    for figures in (keys, calls):
        mean = sum(figures.values()) / len(figures)
        assert max(figures.values()) / mean <= 1.2, figures


def _calls(port: int) -> int:
    stats = redis.Redis(port=port).info("commandstats")
    return sum(
        int(values["calls"])
        for name, values in stats.items()
        if name not in {"cmdstat_info", "cmdstat_cluster|slots", "cmdstat_cluster|nodes"}
    )


def test_a_batch_read_is_one_round_trip_to_each_master(store: PresenceStore) -> None:
    touch_all(store, USERS)
    store.cluster.round_trips.clear()  # type: ignore[union-attr]
    states = store.run(store.plans.read(range(1, 5001)))
    assert states is not None and set(states) == set(USERS)
    trips = store.cluster.round_trips  # type: ignore[union-attr]
    assert len(trips) == 3 and set(trips.values()) == {1}, trips


def test_a_read_of_the_recent_is_one_round_trip_to_each_master(store: PresenceStore) -> None:
    touch_all(store, USERS)
    asked = range(1, 5001)
    plan = store.plans.read_recent(asked, NOW - 300)
    # A script's keys share one slot (a shard's buckets), as a cluster requires.
    for command in plan.commands:
        assert len({key_slot(key.encode()) for key in command[2]}) == 1
    store.run(plan)  # the first use loads the script on each master
    store.cluster.round_trips.clear()  # type: ignore[union-attr]
    states = store.run(store.plans.read_recent(asked, NOW - 300))
    assert states is not None and set(states) == set(USERS)
    trips = store.cluster.round_trips  # type: ignore[union-attr]
    assert len(trips) == 3 and set(trips.values()) == {1}, trips
    assert store.run(store.plans.read_recent(asked, NOW + 1)) == {}


def test_sweeps_claim_due_users_from_every_master(store: PresenceStore) -> None:
    touch_all(store, USERS)
    due, _ = store.run(store.plans.claim_due(NOW + 10_000, 100_000))
    assert sorted(due) == list(USERS)  # every shard visited, each user handed out once
    assert store.run(store.plans.claim_due(NOW + 10_000, 100_000)) == ([], [])


def test_a_master_down_leaves_only_its_users_unknown_and_it_recovers_empty(
    cluster: RedisCluster, store: PresenceStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="presence")
    touch_all(store, USERS)
    victim_port = master_of(cluster, store.keys.seen_key(store.keys.bucket_of(1)))
    victim = cluster.node_by_port(victim_port)
    master_of_user = masters_of_buckets(cluster, store)
    on_victim = {u for u in USERS if master_of_user(u) == victim_port}
    assert 0 < len(on_victim) < len(USERS)
    victim.stop(kill=True)
    try:
        states = store.run(store.plans.read(USERS))
        assert states is not None
        assert set(states) == set(USERS) - on_victim  # the others' users are answered
        # Writes to the other masters are recorded; to the victim's users they fall back.
        other = next(u for u in USERS if u not in on_victim)
        assert store.run(store.plans.touch(other, Device.MOBILE, NOW + 5)) is not None
        assert store.run(store.plans.touch(1, Device.WEB, NOW + 5)) is None
        store.run(store.plans.read(USERS))
        outages = [r for r in caplog.records if "is unavailable" in r.getMessage()]
        assert len(outages) == 1 and str(victim_port) in outages[0].getMessage()
    finally:
        victim.start()
    cluster.wait_ok()
    deadline = time.monotonic() + 10
    while store.run(store.plans.touch(1, Device.WEB, NOW + 6)) is None:
        assert time.monotonic() < deadline, "recording did not resume"
        time.sleep(0.1)
    states = store.run(store.plans.read([1]))
    assert states is not None and states[1].last_active == NOW + 6  # back, empty, recording
    assert any("reachable again" in r.getMessage() for r in caplog.records)


def test_a_late_reply_to_a_page_is_not_an_outage_of_its_master(cluster: RedisCluster) -> None:
    # As on one Redis: a page waits SOCKET_TIMEOUT and answers without the late master, which
    # stays in use (no outage logged, no RETRY_INTERVAL without it, no resync of every user).
    for port in cluster.master_ports():
        redis.Redis(port=port).flushall()
    store = PresenceStore(
        PresenceSettings(REDIS_CLUSTER=tuple(cluster.urls), SOCKET_TIMEOUT=0.1, RETRY_INTERVAL=60)
    )
    try:
        touch_all(store, USERS)
        master_of_user = masters_of_buckets(cluster, store)
        slow_port = master_of_user(1)
        on_slow = {u for u in USERS if master_of_user(u) == slow_port}
        with redis.Redis(port=slow_port) as slow:
            slow.execute_command("CLIENT", "PAUSE", 600)
        states = store.run(store.plans.read(USERS))
        # The other masters' users are answered; the late master's are not (this call).
        assert states is not None and set(states) == set(USERS) - on_slow
        health = store.cluster.health_of(f"127.0.0.1:{slow_port}")  # type: ignore[union-attr]
        assert health.available() and not health.in_outage
        time.sleep(0.6)  # the pause's end (CLIENT PAUSE counts in real time)
        # Recorded at once, well within the RETRY_INTERVAL an outage would have started.
        assert store.run(store.plans.touch(1, Device.WEB, NOW + 5)) is not None
        states = store.run(store.plans.read([1]))
        assert states is not None and states[1].last_active == NOW + 5
        assert store.cluster.health_of(f"127.0.0.1:{slow_port}").recoveries == 0  # type: ignore[union-attr]
    finally:
        store.close()


def test_a_master_refusing_writes_is_its_own_outage_not_the_clusters(
    cluster: RedisCluster, store: PresenceStore, caplog: pytest.LogCaptureFixture
) -> None:
    # One Redis that refuses commands (out of memory) is in an outage; on a cluster that is the
    # refusing master's alone: the other masters' users are still recorded and read.
    caplog.set_level(logging.WARNING, logger="presence")
    master_of_user = masters_of_buckets(cluster, store)
    refusing = master_of_user(1)
    elsewhere = next(u for u in USERS if master_of_user(u) != refusing)
    with redis.Redis(port=refusing) as client:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
    try:
        assert store.run(store.plans.touch(1, Device.WEB, NOW)) is None
        assert store.run(store.plans.touch(elsewhere, Device.WEB, NOW + 1)) is not None
        states = store.run(store.plans.read([1, elsewhere]))
        assert states is not None and states[elsewhere].last_active == NOW + 1
        assert not store.known_down()

        async def on_the_event_loop() -> tuple[Any, Any]:
            fresh = PresenceStore(store.conf)  # (its masters' health its own: none down yet)
            try:
                refused = await fresh.arun(fresh.plans.touch(1, Device.WEB, NOW + 2), live=True)
                other = await fresh.arun(
                    fresh.plans.touch(elsewhere, Device.WEB, NOW + 2), live=True
                )
                return refused, other
            finally:
                await fresh.aclose()

        refused, other = asyncio.run(on_the_event_loop())
        assert refused is None and other is not None
        outages = [r.getMessage() for r in caplog.records if "is unavailable" in r.getMessage()]
        assert outages and all(f"node 127.0.0.1:{refusing} " in o for o in outages), outages
    finally:
        with redis.Redis(port=refusing) as client:
            client.config_set("maxmemory", 0)


def test_a_room_is_written_only_once_its_schedule_is(
    cluster: RedisCluster, store: PresenceStore
) -> None:
    # A room's keys and its schedule are on two masters: with the schedule's down, a join or a
    # leave writes nothing (it fails), so no room is ever left without a due time.
    room = next(
        f"post:{n}"
        for n in range(1, 1000)
        if master_of(cluster, store.keys.room_schedule_key(f"post:{n}"))
        != master_of(cluster, store.keys.room_key(f"post:{n}", "n"))
    )
    room_port = master_of(cluster, store.keys.room_key(room, "n"))
    victim = cluster.node_by_port(master_of(cluster, store.keys.room_schedule_key(room)))

    def room_keys() -> list[Any]:
        with redis.Redis(port=room_port) as client:
            return list(client.scan_iter(match=f"*{{room:{room}}}*"))

    victim.stop(kill=True)
    try:
        assert store.run(store.plans.join_room(room, 7, "c1", NOW)) is None
        assert store.run(merge([store.plans.join_room(room, 8, "c2", NOW)])) == [None]

        async def join_on_the_event_loop() -> Any:
            try:
                return await store.arun(store.plans.join_room(room, 9, "c3", NOW), live=True)
            finally:
                await store.aclose()

        assert asyncio.run(join_on_the_event_loop()) is None
        assert room_keys() == []  # no member, no outbox entry: nothing unscheduled
    finally:
        victim.start()
    cluster.wait_ok()
    deadline = time.monotonic() + 10
    while (written := store.run(store.plans.join_room(room, 7, "c1", NOW))) is None:
        assert time.monotonic() < deadline, "the join did not succeed again"
        time.sleep(0.1)
    assert written.joined and room_keys()
    assert store.run(store.plans.leave_room(room, 7, "c1", NOW + 1)) is not None
    assert room in store.run(store.plans.claim_rooms(NOW + 3600, 100))


@pytest.mark.django_db(transaction=True)
def test_a_room_sweep_with_a_master_unavailable_sweeps_and_announces_the_others(
    cluster: RedisCluster, settings: Any, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two rooms due, swept together, one's keys on a master that refuses every write (too few
    # replicas: unavailable, its data kept). The other is swept and its leaves announced (what
    # the sweep returns); the first is swept by the next sweep once its master writes again.
    settings.PRESENCE = {"REDIS_CLUSTER": cluster.urls, "RETRY_INTERVAL": 0.2}
    monkeypatch.setattr(writes, "_unswept", set())
    store = get_store()
    for port in cluster.master_ports():
        with redis.Redis(port=port) as client:
            client.flushall()
    keys_on = {
        room: master_of(cluster, store.keys.room_key(room, "n"))
        for room in (f"post:{n}" for n in range(1, 200))
    }
    schedule_on = {room: master_of(cluster, store.keys.room_schedule_key(room)) for room in keys_on}
    refused = next(room for room in keys_on if schedule_on[room] != keys_on[room])
    refusing = keys_on[refused]
    swept = next(room for room in keys_on if refusing not in (keys_on[room], schedule_on[room]))
    now = time.time()
    for user, room in enumerate((refused, swept), start=1):
        assert store.run(store.plans.join_room(room, user, "c1", now)) is not None
        assert store.run(store.plans.leave_room(room, user, "c1", now)) is not None
    clock.shift(get_settings().OFFLINE_GRACE + 3)

    async def sweep() -> dict[str, list[Any]]:
        try:
            return await writes.asweep_rooms()
        finally:
            await store.aclose()

    with redis.Redis(port=refusing) as client:
        client.config_set("min-replicas-to-write", 1)  # it has none: every write refused
    try:
        assert asyncio.run(sweep()) == {swept: [2]}
    finally:
        with redis.Redis(port=refusing) as client:
            client.config_set("min-replicas-to-write", 0)
    clock.shift(1)  # (past RETRY_INTERVAL: the master is asked again)
    assert asyncio.run(sweep()) == {refused: [1]}


def masters_of_buckets(cluster: RedisCluster, store: PresenceStore) -> Callable[[int], int]:
    """The port of the master holding each user's bucket, from one read of CLUSTER SLOTS."""
    owners = _slot_owner(cluster)
    return lambda user_id: owners[
        key_slot(store.keys.seen_key(store.keys.bucket_of(user_id)).encode())
    ]


def _slot_owner(cluster: RedisCluster) -> dict[int, int]:
    client = redis.Redis(port=cluster.master_ports()[0])
    owners: dict[int, int] = {}
    for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
        for slot in range(start, end + 1):
            owners[slot] = int(master[1])
    client.close()
    return owners


def test_scripts_flushed_on_every_master_are_loaded_again(
    cluster: RedisCluster, store: PresenceStore
) -> None:
    touch_all(store, range(1, 50))
    for port in cluster.master_ports():
        redis.Redis(port=port).script_flush()
    touch_all(store, range(1, 50), at=NOW + 1)
    states = store.run(store.plans.read(range(1, 50)))
    assert states is not None and {s.last_active for s in states.values()} == {NOW + 1}
    assert store.cluster is not None and store.cluster.redirects["noscript"] >= 3

    async def beat() -> None:
        for port in cluster.master_ports():
            redis.Redis(port=port).script_flush()
        transition = await store.arun(store.plans.connection(7, "open", NOW + 2, "c1"))
        assert transition is not None and transition.after.connected
        await store.aclose()

    asyncio.run(beat())


def test_reads_after_a_script_a_master_lost_read_its_writes(
    cluster: RedisCluster, store: PresenceStore
) -> None:
    # The master knows the plan's other commands but not its write's script: the reads after
    # it in its slot, which ran before it, are sent again after it; no write runs twice.
    assert store.run(written_then_read()) == [1, 1, 1, 1]

    async def again() -> list[int]:
        replies = await store.arun(written_then_read(), live=True)
        await store.aclose()
        return replies

    assert asyncio.run(again()) == [2, 2, 2, 2]


def test_a_slot_range_resharded_under_writes_loses_no_write(
    cluster: RedisCluster, store: PresenceStore
) -> None:
    users = range(1, 2001)
    stop = threading.Event()
    written: Counter[int] = Counter()
    failures: list[BaseException] = []

    def write() -> None:
        second = NOW
        try:
            while not stop.is_set() and second < NOW + 10_000:
                second += 1
                for start in range(0, len(users), 250):
                    chunk = users[start : start + 250]
                    results = store.run(
                        merge([store.plans.touch(u, Device.WEB, second) for u in chunk])
                    )
                    for user_id, result in zip(chunk, results, strict=True):
                        if result is not None:
                            written[user_id] = second
        except BaseException as error:
            failures.append(error)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        time.sleep(0.3)  # writes are under way
        ports = cluster.master_ports()
        source, target = ports[0], ports[1]
        ids = _node_ids(cluster)
        cluster.cli(
            "--cluster",
            "reshard",
            f"127.0.0.1:{source}",
            "--cluster-from",
            ids[source],
            "--cluster-to",
            ids[target],
            "--cluster-slots",
            "600",
            "--cluster-yes",
            timeout=90,
        )
        # A whole round of writes after the reshard, however slow a busy machine makes them.
        resharded_at = max(written.values(), default=NOW)
        deadline = time.monotonic() + 60
        while max(written.values(), default=NOW) < resharded_at + 2 and not failures:
            assert time.monotonic() < deadline, "the writes stopped"
            time.sleep(0.05)
    finally:
        stop.set()
        writer.join(timeout=30)
    assert not failures, failures
    assert len(written) == len(users)
    assert store.cluster is not None
    # Redirects happen only while slots move: writes ran during the reshard.
    assert store.cluster.redirects["moved"] + store.cluster.redirects["ask"] > 0
    states = store.run(store.plans.read(users))
    assert states is not None
    # Every write that was acknowledged is there: no user is behind what it was told.
    lost = [u for u in users if states[u].last_active != written[u]]
    assert lost == []


def _node_ids(cluster: RedisCluster) -> dict[int, str]:
    lines = cluster.cli("CLUSTER", "NODES", port=cluster.master_ports()[0]).splitlines()
    return {int(line.split()[1].split("@")[0].rsplit(":", 1)[1]): line.split()[0] for line in lines}


def test_a_promoted_replica_takes_over_the_writes() -> None:
    with RedisCluster(masters=3, replicas=1, node_timeout_ms=1000) as cluster:
        conf = PresenceSettings(REDIS_CLUSTER=tuple(cluster.urls), RETRY_INTERVAL=0.2)
        store = PresenceStore(conf)
        try:
            assert store.run(store.plans.touch(1, Device.WEB, NOW)) is not None
            old_master = master_of(cluster, store.keys.seen_key(store.keys.bucket_of(1)))
            replica = _replica_of(cluster, old_master)
            cluster.cli("CLUSTER", "FAILOVER", port=replica)
            deadline = time.monotonic() + 15
            while master_of(cluster, store.keys.seen_key(store.keys.bucket_of(1))) != replica:
                assert time.monotonic() < deadline, "the replica was not promoted"
                time.sleep(0.1)
            started = time.monotonic()
            while store.run(store.plans.touch(1, Device.WEB, NOW + 1)) is None:
                assert time.monotonic() - started < 5, "writes did not move to the new master"
                time.sleep(0.1)
            states = store.run(store.plans.read([1]))
            assert states is not None and states[1] == domain.LiveState(
                last_active=NOW + 1, devices=(Device.WEB,)
            )
        finally:
            store.close()


def _replica_of(cluster: RedisCluster, master_port: int) -> int:
    ids = _node_ids(cluster)
    lines = cluster.cli("CLUSTER", "NODES", port=master_port).splitlines()
    for line in lines:
        fields = line.split()
        if "slave" in fields[2] and fields[3] == ids[master_port]:
            return int(fields[1].split("@")[0].rsplit(":", 1)[1])
    raise AssertionError("no replica")


# --- the site on the cluster, a master down ------------------------------------------------


def _on_master(cluster: RedisCluster, store: PresenceStore, users: list[Any]) -> dict[int, list]:
    owners = _slot_owner(cluster)
    placed: dict[int, list[Any]] = {}
    for user in users:
        slot = key_slot(store.keys.seen_key(store.keys.bucket_of(user.pk)).encode())
        placed.setdefault(owners[slot], []).append(user)
    return placed


@pytest.mark.django_db(transaction=True)
def test_with_a_master_down_pages_stay_up_and_the_rest_is_recorded(
    cluster: RedisCluster,
    store: PresenceStore,
    settings: Any,
    client: Client,
    make_user: Callable[..., Any],
) -> None:
    settings.PRESENCE = {"REDIS_CLUSTER": cluster.urls, "RETRY_INTERVAL": 0.2}
    users = [make_user() for _ in range(24)]
    placed = _on_master(cluster, get_store(), users)
    victim_port = sorted(placed)[0]
    (down_user, *_), (up_user, *_) = placed[victim_port], placed[sorted(placed)[1]]
    victim = cluster.node_by_port(victim_port)
    victim.stop(kill=True)
    try:
        for user in (down_user, up_user):
            client.force_login(user)
            started = time.monotonic()
            assert client.get("/").status_code == 200
            assert time.monotonic() - started < 1.0  # no retry loop, no long timeout
        viewer = up_user
        seen = api.bulk_presence([down_user, up_user], viewer)
        assert seen[up_user.pk].status is Status.ONLINE  # recorded on a live master
        assert seen[down_user.pk].status is Status.OFFLINE  # unknown: the database's view
    finally:
        victim.start()
    cluster.wait_ok()


@pytest.mark.django_db(transaction=True)
def test_with_a_master_down_sockets_stay_open_and_heartbeats_elsewhere_count(
    cluster: RedisCluster,
    store: PresenceStore,
    settings: Any,
    make_user: Callable[..., Any],
) -> None:
    settings.PRESENCE = {
        "REDIS_CLUSTER": cluster.urls,
        "RETRY_INTERVAL": 0.2,
        "SWEEP_INTERVAL": 3600,
    }
    users = [make_user() for _ in range(24)]
    placed = _on_master(cluster, get_store(), users)
    victim_port = sorted(placed)[0]
    (down_user, *_), (up_user, *_) = placed[victim_port], placed[sorted(placed)[1]]
    victim = cluster.node_by_port(victim_port)

    async def scenario() -> None:
        app = URLRouter(websocket_urlpatterns)
        sockets = []
        try:
            for user in (down_user, up_user):
                socket = WebsocketCommunicator(app, "/ws/presence/")
                socket.scope["user"] = user
                assert (await socket.connect(timeout=10))[0]
                sockets.append(socket)
            victim.stop(kill=True)
            for socket in sockets:
                await socket.send_json_to({"type": "heartbeat"})
                await socket.send_json_to({"type": "subscribe", "users": [up_user.pk]})
                reply = await socket.receive_json_from(timeout=10)
                assert reply["type"] == "presence_state"
                assert reply["presences"][str(up_user.pk)]["status"] in {"online", "offline"}
            for socket in sockets:
                assert await socket.receive_nothing(timeout=0.3)  # still open, nothing odd
            states = await get_store().arun(get_store().plans.read([up_user.pk]))
            assert states is not None and states[up_user.pk].connected
        finally:
            for socket in sockets:
                await socket.disconnect(timeout=10)
            await get_store().aclose()

    try:
        async_to_sync(scenario)()
    finally:
        victim.start()
        cluster.wait_ok()


def test_a_master_killed_fails_over_to_its_replica_within_the_node_timeout() -> None:
    node_timeout = 1.0
    with RedisCluster(masters=3, replicas=1, node_timeout_ms=int(node_timeout * 1000)) as cluster:
        conf = PresenceSettings(REDIS_CLUSTER=tuple(cluster.urls), RETRY_INTERVAL=0.2)
        store = PresenceStore(conf)
        try:
            assert store.run(store.plans.touch(1, Device.WEB, NOW)) is not None
            old_master = master_of(cluster, store.keys.seen_key(store.keys.bucket_of(1)))
            cluster.node_by_port(old_master).stop(kill=True)
            killed = time.monotonic()
            second = NOW
            while store.run(store.plans.touch(1, Device.WEB, second + 1)) is None:
                second += 1
                assert time.monotonic() - killed < node_timeout + 10, "no failover"
                time.sleep(0.1)
            recovered = time.monotonic() - killed
            # cluster-node-timeout to notice, an election, then our retry and slot refresh
            print(f"failover: writes recorded again {recovered:.2f} s after the kill")
            assert recovered < node_timeout + 5, recovered
            states = store.run(store.plans.read([1]))
            assert states is not None and states[1].last_active == second + 1
        finally:
            store.close()


def test_a_store_started_while_the_first_master_is_down_serves_the_others(
    cluster: RedisCluster, store: PresenceStore
) -> None:
    # The master of slot 0 is the one redis-py asks for its command table first.
    first = _slot_owner(cluster)[0]
    cluster.node_by_port(first).stop(kill=True)
    try:
        fresh = PresenceStore(store.conf)
        master_of_user = masters_of_buckets(cluster, fresh)
        placed = {u: master_of_user(u) for u in range(1, 40)}
        elsewhere = [u for u, port in placed.items() if port != first]
        there = [u for u, port in placed.items() if port == first]
        assert elsewhere and there

        states = fresh.run(merge([fresh.plans.touch(u, Device.WEB, NOW) for u in placed]))
        assert [u for u, s in zip(placed, states, strict=True) if s is not None] == elsewhere

        async def read_fresh() -> Any:
            async_store = PresenceStore(store.conf)
            try:
                return await async_store.arun(async_store.plans.read(list(placed)))
            finally:
                await async_store.aclose()

        live = asyncio.run(read_fresh())
        assert live is not None and sorted(live) == elsewhere
        fresh.close()
    finally:
        cluster.node_by_port(first).start()
    cluster.wait_ok()


@pytest.mark.django_db(transaction=True)
def test_cleanup_with_a_master_down_cleans_up_the_others_and_names_it(
    cluster: RedisCluster, settings: Any, clock: Any, make_user: Callable[..., Any]
) -> None:
    settings.PRESENCE = {"REDIS_CLUSTER": cluster.urls, "RETRY_INTERVAL": 0.2}
    store = get_store()
    for port in cluster.master_ports():
        with redis.Redis(port=port) as client:
            client.flushall()
    users = [make_user() for _ in range(12)]
    for user in users:
        assert store.run(store.plans.touch(user.pk, Device.WEB, time.time())) is not None
    placed = _on_master(cluster, store, users)
    victim_port = sorted(placed)[0]
    healthy = {user.pk for port, on in placed.items() if port != victim_port for user in on}
    assert healthy
    # A room all of whose keys are on the healthy masters, its member's stay to end.
    room = next(
        room
        for room in (f"post:{n}" for n in range(1, 200))
        if victim_port
        not in (
            master_of(cluster, store.keys.room_key(room, "n")),
            master_of(cluster, store.keys.room_schedule_key(room)),
        )
    )
    assert store.run(store.plans.join_room(room, users[0].pk, "c1", time.time())) is not None
    assert store.run(store.plans.leave_room(room, users[0].pk, "c1", time.time())) is not None
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    victim = cluster.node_by_port(victim_port)
    said = StringIO()
    victim.stop(kill=True)
    try:
        with pytest.raises(CommandError) as error:
            call_command("presence_cleanup", stdout=said)
    finally:
        victim.start()
    cluster.wait_ok()
    # The healthy masters' users persisted and removed, their room swept; the master named.
    persisted = LastSeen.objects.filter(user_id__in=[user.pk for user in users])
    assert set(persisted.values_list("user_id", flat=True)) == healthy
    assert store.run(store.plans.read(list(healthy))) == {}
    assert "1 room members whose stay ended removed from 1 rooms" in said.getvalue()
    named = str(error.value)
    assert f"127.0.0.1:{victim_port} was unavailable" in named, named
    assert all(str(port) not in named for port in placed if port != victim_port), named
