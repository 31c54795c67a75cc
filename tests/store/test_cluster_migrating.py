"""A slot migrating on a real Redis Cluster (tools/redis_cluster.py), in the states
``redis-cli --cluster reshard`` leaves it in: ``CLUSTER SETSLOT`` IMPORTING on the target and
MIGRATING on the source, then ``MIGRATE`` of its keys in batches. Only that slot's commands wait
for it: its master, source or target, is not in an outage, and the other users on it are read
and written as before.

Each test's cluster runs on loopback and is stopped by pid afterwards (as tests/store/
test_cluster.py's: its own, in the plain run).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from presence.conf import PresenceSettings
from presence.domain import Device
from presence.store import PresenceStore, StoreUnavailable, merge
from presence.store.plans import Plan
from tests.store.test_cluster import _node_ids, _slot_owner, master_of
from tools.redis_cluster import RedisCluster

NOW = 1_800_000_000
USERS = range(1, 3001)


class Migration:
    """One slot moved from ``source`` to ``target`` as redis-cli's reshard moves it."""

    def __init__(self, cluster: RedisCluster, slot: int, source: int, target: int) -> None:
        self.cluster, self.slot, self.source, self.target = cluster, slot, source, target
        self.ids = _node_ids(cluster)

    def begin(self) -> None:
        with redis.Redis(port=self.target) as target:
            target.execute_command("CLUSTER SETSLOT", self.slot, "IMPORTING", self.ids[self.source])
        with redis.Redis(port=self.source) as source:
            source.execute_command("CLUSTER SETSLOT", self.slot, "MIGRATING", self.ids[self.target])

    def move(self, keys: Sequence[str]) -> None:
        """One MIGRATE batch of these keys."""
        with redis.Redis(port=self.source) as source:
            source.execute_command("MIGRATE", "127.0.0.1", self.target, "", 0, 5000, "KEYS", *keys)

    def finish(self) -> None:
        """The slot's other keys moved, and the slot given to the target (as reshard ends)."""
        with redis.Redis(port=self.source, decode_responses=True) as source:
            left = source.execute_command("CLUSTER GETKEYSINSLOT", self.slot, 1000)
        if left:
            self.move(left)
        for port in self.cluster.master_ports():
            with redis.Redis(port=port) as node:
                node.execute_command("CLUSTER SETSLOT", self.slot, "NODE", self.ids[self.target])

    def abandon(self) -> None:
        for port in self.cluster.master_ports():
            with redis.Redis(port=port) as node:
                node.execute_command("CLUSTER SETSLOT", self.slot, "STABLE")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(masters=3) as running:
        yield running


@pytest.fixture
def store(cluster: RedisCluster) -> Iterator[PresenceStore]:
    for port in cluster.master_ports():
        with redis.Redis(port=port) as client:
            client.flushall()
    built = PresenceStore(PresenceSettings(REDIS_CLUSTER=tuple(cluster.urls), RETRY_INTERVAL=60))
    yield built
    built.close()


@pytest.fixture
def migrations(cluster: RedisCluster) -> Iterator[list[Migration]]:
    """The tests' migrations, each left stable afterwards (the cluster is the module's)."""
    started: list[Migration] = []
    yield started
    for migration in started:
        migration.abandon()


def _migrating(
    cluster: RedisCluster, migrations: list[Migration], key: str, target: int | None = None
) -> Migration:
    source = master_of(cluster, key)
    if target is None:
        target = next(port for port in cluster.master_ports() if port != source)
    migration = Migration(cluster, key_slot(key.encode()), source, target)
    migrations.append(migration)
    migration.begin()
    return migration


def _users_elsewhere_on(
    cluster: RedisCluster, store: PresenceStore, port: int, slot: int
) -> list[int]:
    """Users of other shards than the migrating slot's, on the master at ``port``."""
    owners = _slot_owner(cluster)
    users = []
    for user in USERS:
        user_slot = key_slot(store.keys.seen_key(store.keys.bucket_of(user)).encode())
        if user_slot != slot and owners[user_slot] == port:
            users.append(user)
    assert users
    return users[:5]


def _still_serves(store: PresenceStore, port: int, users: list[int], at: int) -> None:
    """The master at ``port`` is in no outage, and its other users are read and written."""
    assert store.cluster is not None
    health = store.cluster.health_of(f"127.0.0.1:{port}")
    assert health.available() and not health.in_outage
    states = store.run(store.plans.read(users))
    assert states is not None and set(states) == set(users)
    touched = store.run(merge([store.plans.touch(user, Device.WEB, at) for user in users]))
    assert all(transition is not None for transition in touched), touched
    states = store.run(store.plans.read(users))
    assert states is not None and {states[user].last_active for user in users} == {at}


def _no_outage_logged(caplog: pytest.LogCaptureFixture) -> None:
    outages = [r.getMessage() for r in caplog.records if "is unavailable" in r.getMessage()]
    assert outages == []


def _run_in(face: str, store: PresenceStore, plans: list[Plan[Any]]) -> list[Any]:
    """The plans' results, one after the other, on the sync face or on an event loop."""
    if face == "sync":
        return [store.run(plan) for plan in plans]

    async def on_the_event_loop() -> list[Any]:
        try:
            return [await store.arun(plan, live=True) for plan in plans]
        finally:
            await store.aclose()

    return asyncio.run(on_the_event_loop())


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_room_script_meeting_a_key_moved_waits_alone(
    cluster: RedisCluster,
    store: PresenceStore,
    migrations: list[Migration],
    caplog: pytest.LogCaptureFixture,
    face: str,
) -> None:
    # A room's scripts build its keys other than the summary in Lua: one of them moved first,
    # Redis stops the script ("non local key"). That join is unknown, as one whose slot is
    # still redirected; the master is no outage.
    caplog.set_level(logging.WARNING, logger="presence")
    room = "topic:42"
    for user in range(1, 6):
        assert store.run(store.plans.join_room(room, user, f"c{user}", NOW)) is not None
    summary = store.plans.room_keys(room)[0]
    migration = _migrating(cluster, migrations, summary)
    others = _users_elsewhere_on(cluster, store, migration.source, migration.slot)
    store.run(merge([store.plans.touch(user, Device.WEB, NOW) for user in others]))
    with redis.Redis(port=migration.source, decode_responses=True) as source:
        keys = source.execute_command("CLUSTER GETKEYSINSLOT", migration.slot, 100)
    migration.move([key for key in keys if key != summary][:1])

    joined, states = _run_in(
        face,
        store,
        [store.plans.join_room(room, 6, "c6", NOW + 1), store.plans.read(others)],
    )

    assert joined is None  # unknown to this join alone
    assert states is not None and set(states) == set(others)
    assert store.cluster is not None and store.cluster.redirects["moving"] >= 1
    _still_serves(store, migration.source, others, NOW + 2)
    _no_outage_logged(caplog)


def test_a_touch_whose_seeded_marker_moved_first_writes_nothing_and_waits(
    cluster: RedisCluster,
    store: PresenceStore,
    migrations: list[Migration],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The shard's :seeded marker moved before its ledger: the touch is redirected before it
    # runs (the marker is one of its KEYS), so nothing of it is written half-way (its last
    # seen without the ledger, which a later touch would take for the user already online).
    caplog.set_level(logging.WARNING, logger="presence")
    keys = store.keys
    store.run(store.plans.seed(keys.shards(), {}, {}))
    late = 7
    shard, bucket = keys.shard_of_user(late), keys.bucket_of(late)
    neighbours = [late + store.conf.BUCKETS, late + 2 * store.conf.BUCKETS]
    assert all(keys.bucket_of(user) == bucket for user in neighbours)
    hidden = next(
        u for u in USERS if keys.shard_of_user(u) == shard and keys.bucket_of(u) != bucket
    )
    # Every key the touch declares exists, so Redis runs it on the source (none is missing):
    # the bucket's seen, connections and prior set, the shard's ledger (online, hidden,
    # invisible) and outbox.
    store.run(store.plans.touch(neighbours[0], Device.WEB, NOW - 3 * 86400))
    store.run(store.plans.touch(neighbours[0], Device.WEB, NOW))
    assert store.run(store.plans.connection(neighbours[1], "open", NOW, "c1")) is not None
    store.run(store.plans.set_invisible(hidden, True))
    store.run(store.plans.touch(hidden, Device.WEB, NOW))
    declared = [
        keys.seen_key(bucket),
        keys.conns_key(bucket),
        *keys.ledger_keys(shard),
        keys.outbox_key(shard),
        keys.prior_key(bucket),
    ]
    with redis.Redis(port=master_of(cluster, declared[0])) as source:
        assert source.exists(*declared) == len(declared)
    marker = keys.seeded_key(shard)
    migration = _migrating(cluster, migrations, marker)
    others = _users_elsewhere_on(cluster, store, migration.source, migration.slot)
    store.run(merge([store.plans.touch(user, Device.WEB, NOW) for user in others]))
    migration.move([marker])  # first in a MIGRATE batch

    assert store.run(store.plans.touch(late, Device.WEB, NOW)) is None

    with redis.Redis(port=migration.source) as source:
        assert source.zscore(keys.seen_key(bucket), str(late)) is None  # nothing written
    _still_serves(store, migration.source, others, NOW + 1)
    _no_outage_logged(caplog)
    # Once the slot moved, the touch is recorded, and makes the user online (made: 1).
    migration.finish()
    transition = store.run(store.plans.touch(late, Device.WEB, NOW))
    assert transition is not None and transition.made == 1


def test_a_seed_asked_to_the_target_before_its_marks_moved_writes_nothing_there(
    cluster: RedisCluster,
    store: PresenceStore,
    migrations: list[Migration],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The shard is not seeded and holds a user's choice written meanwhile (:touched). Its
    # ledger and schedule moved to the target, :touched not yet: the seed is redirected before
    # it runs, on the source (TRYAGAIN) rather than run on the target by ASK and stopped there
    # at :touched after it wrote.
    caplog.set_level(logging.WARNING, logger="presence")
    keys = store.keys
    chooser, visible = 7, 7 + store.conf.BUCKETS
    shard = keys.shard_of_user(chooser)
    assert keys.shard_of_user(visible) == shard
    # Not seeded: a user coming online is taken for invisible ("hidden") until their choice
    # is written; ``chooser``'s choice is marked in :touched.
    for user in (chooser, visible):
        store.run(store.plans.touch(user, Device.WEB, NOW))
    assert store.run(store.plans.set_invisible(visible, False))  # (the ledger's online set)
    store.run(store.plans.set_invisible(chooser, True))
    store.run(store.plans.schedule_expiry(chooser, NOW + 600))
    online, hidden_set, invisible = keys.ledger_keys(shard)
    moved = [online, hidden_set, invisible, keys.shard_expiring_key(shard)]
    with redis.Redis(port=master_of(cluster, invisible)) as source:
        assert source.exists(*moved, f"{invisible}:touched") == len(moved) + 1
    migration = _migrating(cluster, migrations, invisible)
    others = _users_elsewhere_on(cluster, store, migration.target, migration.slot)
    store.run(merge([store.plans.touch(user, Device.WEB, NOW) for user in others]))
    migration.move(moved)
    invisible_before = _members(migration.target, invisible)

    with pytest.raises(StoreUnavailable):
        store.run(store.plans.seed([shard], {shard: [99_999]}, {}))

    assert _asking(migration.target, "EXISTS", f"{invisible}:seeding") == 0  # nothing written
    assert _members(migration.target, invisible) == invisible_before
    _still_serves(store, migration.target, others, NOW + 1)
    _no_outage_logged(caplog)


def _shard_with_its_sets(store: PresenceStore, user: int) -> int:
    """The user's shard seeded, the user online, its "hidden" and "invisible" sets holding
    another of its users: every key a choice's write declares exists but ``:touched``, whose
    keeping is under test."""
    keys = store.keys
    store.run(store.plans.seed(keys.shards(), {}, {}))
    shard = keys.shard_of_user(user)
    hidden = next(u for u in USERS if keys.shard_of_user(u) == shard and u != user)
    store.run(store.plans.touch(user, Device.WEB, NOW))
    store.run(store.plans.set_invisible(hidden, True))
    store.run(store.plans.touch(hidden, Device.WEB, NOW))
    return shard


def _writes_a_choice_while_migrating(
    cluster: RedisCluster, store: PresenceStore, migrations: list[Migration], user: int
) -> None:
    keys = store.keys
    shard = keys.shard_of_user(user)
    online, hidden, invisible = keys.ledger_keys(shard)
    with redis.Redis(port=master_of(cluster, invisible)) as source:
        assert source.exists(online, hidden, invisible, keys.seeded_key(shard)) == 4
    migration = _migrating(cluster, migrations, invisible)  # begun, nothing moved yet
    others = _users_elsewhere_on(cluster, store, migration.source, migration.slot)
    store.run(merge([store.plans.touch(u, Device.WEB, NOW) for u in others]))

    assert store.run(store.plans.set_invisible(user, True)) is True  # (moved to "hidden")

    with redis.Redis(port=migration.source) as source:
        assert source.sismember(invisible, str(user))
        assert source.zscore(hidden, str(user)) is not None
    _still_serves(store, migration.source, others, NOW + 1)


def test_a_choice_is_written_on_a_seeded_shard_whose_slot_migrates(
    cluster: RedisCluster,
    store: PresenceStore,
    migrations: list[Migration],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The choice's script declares the shard's :touched, which a seed keeps (with a member no
    # user's mark is): were it absent, Redis would redirect the script (ASK, then TRYAGAIN)
    # for the whole migration, and the choice could not be written until it ended.
    caplog.set_level(logging.WARNING, logger="presence")
    user = 7
    _shard_with_its_sets(store, user)

    _writes_a_choice_while_migrating(cluster, store, migrations, user)
    _no_outage_logged(caplog)


def test_a_shard_seeded_without_touched_kept_gets_it_from_its_next_choice(
    cluster: RedisCluster,
    store: PresenceStore,
    migrations: list[Migration],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A shard seeded by an older version (its seed deleted :touched): the first choice written
    # on it, its slot stable, keeps the key, so the next is written while the slot migrates.
    caplog.set_level(logging.WARNING, logger="presence")
    user, first = 7, 7 + store.conf.BUCKETS
    shard = _shard_with_its_sets(store, user)
    touched = store.keys.seed_keys(shard)[1]
    with redis.Redis(port=master_of(cluster, touched)) as master:
        master.delete(touched)
    store.run(store.plans.set_invisible(first, True))

    _writes_a_choice_while_migrating(cluster, store, migrations, user)
    _no_outage_logged(caplog)


def _members(port: int, key: str) -> set[bytes]:
    return set(_asking(port, "SMEMBERS", key))


def _asking(port: int, *command: Any) -> Any:
    """A command sent to the node at ``port`` after ASKING (a key of a slot it imports)."""
    with redis.Redis(port=port, single_connection_client=True) as node:
        node.execute_command("ASKING")
        return node.execute_command(*command)
