"""The Redis store against a real Redis: live connections, schedules, merged plans.

Helpers: tests/store/stores.py.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import psutil
import pytest
import redis
from django.test import override_settings
from redis.cluster import key_slot

from presence import domain
from presence.conf import PresenceSettings, get_settings
from presence.domain import Device
from presence.store import (
    CLAIM_DUE,
    CONNECTION,
    RAISE,
    TOUCH,
    ConnectionOp,
    KeyScheme,
    Plan,
    PresenceStore,
    StoreUnavailable,
    Transition,
    get_store,
    merge,
    nodes,
)
from presence.store.keys import shard_tags
from tests.conftest import cluster_urls, on_one_redis
from tests.ids import member, uid
from tests.privacy_cases import count_round_trips
from tests.store.stores import KEYS, NOW, SEEN, entries, live
from tests.store.stores import down_store as down_store
from tests.store.stores import store as store

pytestmark = [pytest.mark.uuid_site, pytest.mark.cluster]


# --- live connections, schedules, merged plans ------------------------------------------------

DUE = KEYS.user_due_key(5)
EXPIRING = KEYS.user_expiring_key(5)
#: default CONNECTION_TTL, OFFLINE_GRACE and ONLINE_WINDOW
TTL, GRACE, WINDOW = 90, 5, 300
#: when a heartbeat's TTL and a close's grace end, after the second the store keeps: both count
#: from the end of that second (domain.offline_at), so neither is ever cut short
TTL_END, GRACE_END = TTL + 1, GRACE + 1
CONNECTED = 16
IDLE = 8


def score(seconds: int, mask: int, idle: bool = False, connected: bool = True) -> int:
    """The documented encoding: seconds * 32 + device mask + 8 * idle + 16 * connected."""
    return seconds * 32 + mask + IDLE * idle + CONNECTED * connected


def conn(
    store: PresenceStore,
    op: ConnectionOp,
    now: float,
    connection_id: str = "c1",
    device: Device = Device.WEB,
    idle: bool = False,
    user_id: int = 5,
) -> Transition:
    transition = store.run(
        store.plans.connection(user_id, op, now, connection_id, device=device, idle=idle)
    )
    assert transition is not None
    return transition


def has_connections(redis_client: redis.Redis, user_id: int = 5) -> bool:
    """Whether anything of the user's connections is left in Redis (aggregate or entries)."""
    bucket = KEYS.bucket_of(user_id)
    fields = [
        f for f in redis_client.hkeys(KEYS.conns_key(bucket)) if f.split(":")[0] == str(user_id)
    ]
    expiries = redis_client.zrangebylex(KEYS.expiries_key(bucket), f"[{user_id}:", f"({user_id};")
    return bool(fields or expiries)


class TestConnection:
    def test_first_beat_connects(self, store: PresenceStore, redis_client: redis.Redis) -> None:
        transition = conn(store, "beat", NOW + 0.6)
        assert transition == Transition(
            5,
            domain.LiveState(),
            domain.LiveState(last_active=NOW, devices=(Device.WEB,), connected=True),
            connections=1,
        )
        assert redis_client.zscore(SEEN, "5") == score(NOW, 1) == NOW * 32 + 16 + 1
        assert entries(redis_client) == {f"c1:1:0:{NOW}:{NOW}"}
        assert redis_client.zscore(DUE, "5") == NOW + TTL_END

    def test_idle_beat(self, store: PresenceStore, redis_client: redis.Redis) -> None:
        transition = conn(store, "beat", NOW, device=Device.MOBILE, idle=True)
        assert redis_client.zscore(SEEN, "5") == NOW * 32 + 16 + 8 + 2
        assert transition.after == domain.LiveState(
            last_active=NOW, devices=(Device.MOBILE,), connected=True, idle=True
        )
        assert entries(redis_client) == {f"c1:2:1:{NOW}:{NOW}"}

    def test_connected_at_is_kept_across_beats(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        conn(store, "beat", NOW)
        transition = conn(store, "beat", NOW + 30)
        assert entries(redis_client) == {f"c1:1:0:{NOW}:{NOW + 30}"}
        assert redis_client.zscore(SEEN, "5") == score(NOW + 30, 1)
        assert (transition.before.last_active, transition.after.last_active) == (NOW, NOW + 30)
        assert transition.connections == 1
        assert redis_client.zscore(DUE, "5") == NOW + 30 + TTL_END

    def test_connections_aggregate_devices_and_idle(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        conn(store, "beat", NOW, "c1", Device.WEB)
        second = conn(store, "beat", NOW + 10, "c2", Device.MOBILE, idle=True)
        # One active connection: not idle.
        assert redis_client.zscore(SEEN, "5") == score(NOW + 10, 1 | 2)
        assert second.connections == 2
        assert second.after == domain.LiveState(
            last_active=NOW + 10, devices=(Device.WEB, Device.MOBILE), connected=True
        )
        # Idle only once every connection is.
        both_idle = conn(store, "beat", NOW + 20, "c1", Device.WEB, idle=True)
        assert redis_client.zscore(SEEN, "5") == score(NOW + 20, 1 | 2, idle=True)
        assert both_idle.after.idle is True
        assert entries(redis_client) == {
            f"c1:1:1:{NOW}:{NOW + 20}",
            f"c2:2:1:{NOW + 10}:{NOW + 10}",
        }
        # A beat of the same device kind adds a connection, not a device.
        third = conn(store, "beat", NOW + 25, "c3", Device.WEB)
        assert third.connections == 3
        assert redis_client.zscore(SEEN, "5") == score(NOW + 25, 1 | 2)

    def test_close_of_one_connection_keeps_the_other(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        conn(store, "beat", NOW, "c1", Device.WEB)
        conn(store, "beat", NOW + 10, "c2", Device.MOBILE)
        transition = conn(store, "close", NOW + 30, "c1")
        assert transition == Transition(
            5,
            domain.LiveState(
                last_active=NOW + 10, devices=(Device.WEB, Device.MOBILE), connected=True
            ),
            domain.LiveState(last_active=NOW + 10, devices=(Device.MOBILE,), connected=True),
            connections=1,
        )
        assert entries(redis_client) == {f"c2:2:0:{NOW + 10}:{NOW + 10}"}

    def test_close_of_the_last_connection_signs_off_keeping_flags(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        conn(store, "beat", NOW, "c1", Device.DESKTOP, idle=True)
        transition = conn(store, "close", NOW + 20, "c1")
        assert redis_client.zscore(SEEN, "5") == -(NOW + 20) * 32 - 8 - 4
        assert transition == Transition(
            5,
            domain.LiveState(last_active=NOW, devices=(Device.DESKTOP,), connected=True, idle=True),
            domain.LiveState(
                last_active=NOW + 20, devices=(Device.DESKTOP,), signed_off=True, idle=True
            ),
            connections=0,
        )
        assert has_connections(redis_client) is False
        assert redis_client.zscore(DUE, "5") == NOW + 20 + GRACE_END

    def test_close_of_an_unknown_connection_changes_nothing(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        conn(store, "beat", NOW, "c1")
        transition = conn(store, "close", NOW + 5, "nope")
        assert transition.before == transition.after
        assert transition.connections == 1
        assert entries(redis_client) == {f"c1:1:0:{NOW}:{NOW}"}

    def test_expire_drops_connections_past_the_ttl(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        conn(store, "beat", NOW, "c1", Device.WEB)
        conn(store, "beat", NOW + 50, "c2", Device.MOBILE)
        # c1 was last heard TTL + 30 s ago; c2 only 70 s ago.
        transition = conn(store, "expire", NOW + TTL + 30, "-")
        assert transition.connections == 1
        assert transition.after == domain.LiveState(
            last_active=NOW + 50, devices=(Device.MOBILE,), connected=True
        )
        assert entries(redis_client) == {f"c2:2:0:{NOW + 50}:{NOW + 50}"}
        # Once c2 is silent for the TTL too, the user signs off at the last heartbeat.
        transition = conn(store, "expire", NOW + 50 + TTL + 10, "-")
        assert transition.connections == 0
        assert transition.after == domain.LiveState(
            last_active=NOW + 50, devices=(Device.MOBILE,), signed_off=True
        )
        assert redis_client.zscore(SEEN, "5") == -(NOW + 50) * 32 - 2
        assert has_connections(redis_client) is False
        # An expiry check is no activity: the due time is the heartbeat's.
        assert redis_client.zscore(DUE, "5") == NOW + 50 + TTL_END

    @pytest.mark.parametrize(
        ("after", "alive"),
        [(TTL, True), (TTL_END - 0.1, True), (TTL_END, False), (TTL_END + 0.9, False)],
    )
    def test_a_connection_lives_exactly_as_long_as_reads_say(
        self, store: PresenceStore, redis_client: redis.Redis, after: float, alive: bool
    ) -> None:
        # domain.live_status: a connected user is online while now < heartbeat + 1 + TTL. The
        # script drops the connection at that very moment, or a sweep in that second would see
        # an offline user whose connection was never signed off (nor its last seen saved).
        conn(store, "beat", NOW)
        transition = conn(store, "expire", NOW + after, "-")
        assert transition.connections == int(alive)
        assert has_connections(redis_client) is alive
        if alive:
            assert transition.after == domain.LiveState(NOW, (Device.WEB,), connected=True)
        else:
            assert transition.after == domain.LiveState(NOW, (Device.WEB,), signed_off=True)

    def test_expire_of_a_user_without_connections(self, store: PresenceStore) -> None:
        assert conn(store, "expire", NOW, "-", user_id=6) == Transition(
            6, domain.LiveState(), domain.LiveState(), connections=0
        )
        store.run(store.plans.touch(6, Device.WEB, NOW))
        transition = conn(store, "expire", NOW + 10, "-", user_id=6)
        assert (
            transition.before
            == transition.after
            == domain.LiveState(last_active=NOW, devices=(Device.WEB,))
        )

    def test_beat_within_the_grace_reconnects(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        # A page reload: close, then a new connection a moment later.
        conn(store, "beat", NOW, "c1")
        conn(store, "close", NOW + 10, "c1")
        transition = conn(store, "beat", NOW + 11, "c2")
        assert transition.after == domain.LiveState(
            last_active=NOW + 11, devices=(Device.WEB,), connected=True
        )
        assert redis_client.zscore(DUE, "5") == NOW + 11 + TTL_END

    def test_http_touch_keeps_the_connection_within_the_ttl_and_clears_idle(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        conn(store, "beat", NOW, "c1", Device.WEB, idle=True)
        store.run(store.plans.touch(5, Device.WEB, NOW + 10))
        assert redis_client.zscore(SEEN, "5") == score(NOW + 10, 1)
        assert live(store, 5) == domain.LiveState(
            last_active=NOW + 10, devices=(Device.WEB,), connected=True
        )
        # The connection's earlier due time is kept (LT).
        assert redis_client.zscore(DUE, "5") == NOW + TTL_END

    @pytest.mark.parametrize("after", [TTL_END, TTL_END + 1])
    def test_http_touch_after_the_ttl_is_no_connection(
        self, store: PresenceStore, redis_client: redis.Redis, after: int
    ) -> None:
        conn(store, "beat", NOW, "c1", Device.WEB, idle=True)
        store.run(store.plans.touch(5, Device.MOBILE, NOW + after))
        assert redis_client.zscore(SEEN, "5") == score(NOW + after, 1 | 2, connected=False)
        assert live(store, 5) == domain.LiveState(
            last_active=NOW + after, devices=(Device.WEB, Device.MOBILE)
        )

    def test_logout_with_a_live_connection_stays_connected(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        conn(store, "beat", NOW, "c1", Device.WEB)
        transition = store.run(store.plans.sign_off(5, Device.WEB, NOW + 10))
        assert transition is not None
        assert transition.after == domain.LiveState(
            last_active=NOW + 10, devices=(Device.WEB,), connected=True
        )
        assert redis_client.zscore(SEEN, "5") == score(NOW + 10, 1)
        assert redis_client.zscore(DUE, "5") == NOW + 10 + GRACE_END

    def test_logout_after_the_connection_ttl_signs_off(self, store: PresenceStore) -> None:
        conn(store, "beat", NOW, "c1", Device.WEB)
        transition = store.run(store.plans.sign_off(5, Device.WEB, NOW + TTL_END))
        assert transition is not None
        assert transition.after == domain.LiveState(
            last_active=NOW + TTL_END, devices=(Device.WEB,), signed_off=True
        )


class TestConnectionLimit:
    @pytest.fixture(autouse=True)
    def _limit(self, settings: Any) -> None:
        settings.PRESENCE = {"MAX_CONNECTIONS_PER_USER": 3}

    def bucket(self, redis_client: redis.Redis) -> dict[str, Any]:
        """Everything in user 5's bucket and the schedule."""
        return {
            "seen": redis_client.zrange(SEEN, 0, -1, withscores=True),
            "conns": redis_client.hgetall(KEYS.conns_key(5)),
            "expiries": redis_client.zrange(KEYS.expiries_key(5), 0, -1),
            "due": redis_client.zrange(DUE, 0, -1, withscores=True),
        }

    @pytest.mark.parametrize("op", ["open", "beat"])
    def test_a_new_connection_past_the_limit_is_refused_and_changes_nothing(
        self, store: PresenceStore, redis_client: redis.Redis, op: ConnectionOp
    ) -> None:
        for second, connection_id in enumerate(("c1", "c2", "c3")):
            assert conn(store, "open", NOW + second, connection_id).refused is False
        before = self.bucket(redis_client)
        transition = conn(store, op, NOW + 10, "c4", Device.MOBILE)
        assert transition.refused is True
        assert transition.connections == 3
        assert transition.before == transition.after == live(store, 5)
        if op == "open":  # (a beat also sets the due time, to its TTL: see store.plans.connection)
            assert self.bucket(redis_client) == before
        assert entries(redis_client) == {
            f"c1:1:0:{NOW}:{NOW}",
            f"c2:1:0:{NOW + 1}:{NOW + 1}",
            f"c3:1:0:{NOW + 2}:{NOW + 2}",
        }

    def test_the_live_connections_keep_beating_at_the_limit(self, store: PresenceStore) -> None:
        for connection_id in ("c1", "c2", "c3"):
            conn(store, "open", NOW, connection_id)
        transition = conn(store, "beat", NOW + 30, "c2", idle=True)
        assert (transition.refused, transition.connections) == (False, 3)

    def test_a_close_makes_room(self, store: PresenceStore) -> None:
        for connection_id in ("c1", "c2", "c3"):
            conn(store, "open", NOW, connection_id)
        conn(store, "close", NOW + 1, "c2")
        assert conn(store, "open", NOW + 2, "c4").refused is False
        assert conn(store, "open", NOW + 3, "c5").refused is True

    def test_only_connections_within_the_ttl_count(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        conn(store, "open", NOW, "c1")
        conn(store, "open", NOW + 10, "c2")
        conn(store, "open", NOW + 10, "c3")
        assert conn(store, "open", NOW + TTL_END - 0.1, "c4").refused is True
        # c1 is gone by domain.live_status's rule at NOW + TTL_END, swept or not.
        transition = conn(store, "open", NOW + TTL_END, "c4", Device.MOBILE)
        assert (transition.refused, transition.connections) == (False, 3)
        assert {entry.split(":")[0] for entry in entries(redis_client)} == {"c2", "c3", "c4"}
        assert transition.after.devices == (Device.WEB, Device.MOBILE)

    def test_a_dropped_connection_heard_again_counts_as_new(self, store: PresenceStore) -> None:
        conn(store, "open", NOW, "c1")
        conn(store, "open", NOW + TTL_END, "c2")
        conn(store, "open", NOW + TTL_END, "c3")
        conn(store, "open", NOW + TTL_END, "c4")  # c1 was dropped
        assert conn(store, "beat", NOW + TTL_END + 1, "c1").refused is True


class TestDueSchedule:
    def test_an_open_sets_its_due_time_in_its_one_command(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        # A page view opens a socket: its due time is set by the connection script itself
        # (not by a second round trip after it), and a refused open sets none (see
        # TestConnectionLimit).
        plan = store.plans.connection(5, "open", NOW, "c1")
        assert len(plan.commands) == 1
        assert store.run(plan).refused is False
        assert redis_client.zscore(DUE, "5") == NOW + TTL_END

    def test_each_write_sets_when_the_user_turns_offline(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        def due() -> float | None:
            return redis_client.zscore(DUE, "5")

        store.run(store.plans.touch(5, Device.WEB, NOW))
        assert due() == NOW + WINDOW
        store.run(store.plans.touch(5, Device.WEB, NOW + 100))
        assert due() == NOW + WINDOW  # LT: a later time never replaces an earlier one
        conn(store, "beat", NOW + 110)
        assert due() == NOW + 110 + TTL_END
        store.run(store.plans.touch(5, Device.WEB, NOW + 120))
        assert due() == NOW + 110 + TTL_END
        conn(store, "close", NOW + 130)
        assert due() == NOW + 130 + GRACE_END
        store.run(store.plans.sign_off(5, Device.WEB, NOW + 140))
        assert due() == NOW + 140 + GRACE_END

    @on_one_redis
    def test_claim_due_hands_each_user_out_once(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        redis_client.zadd(DUE, {member(1): NOW - 10, member(2): NOW, member(3): NOW + 1})
        redis_client.zadd(EXPIRING, {member(4): NOW - 5, member(5): NOW + 10})
        lease = store.plans.lease_end(NOW + 0.9)
        assert store.run(store.plans.claim_due(NOW + 0.9, 500, lease)) == (
            [uid(1), uid(2)],
            [uid(4)],
        )
        assert store.run(store.plans.claim_due(NOW + 0.9, 500)) == ([], [])
        assert redis_client.zrange(DUE, 0, -1) == [member(3)]
        assert redis_client.zrange(EXPIRING, 0, -1) == [member(5)]
        # The sweeper gives its claims back once done (else they are taken after the lease).
        store.run(store.plans.release(lease, [uid(1), uid(2)], {}))
        assert store.run(store.plans.claim_due(NOW + 10, 500)) == ([uid(3)], [uid(5)])

    @on_one_redis
    def test_claim_due_takes_the_earliest_up_to_the_limit(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        redis_client.zadd(DUE, {member(1): NOW - 1, member(2): NOW - 3, member(3): NOW - 2})
        assert store.run(store.plans.claim_due(NOW, 2)) == ([uid(2), uid(3)], [])
        assert store.run(store.plans.claim_due(NOW, 2)) == ([uid(1)], [])

    def test_schedule_keeps_an_earlier_time(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        # The ceiling: a user is never claimed before ``at`` (claims compare whole seconds), nor
        # a second later than needed (domain.offline_at gives whole seconds).
        assert store.run(store.plans.schedule({5: NOW + 100})) is True
        assert redis_client.zscore(DUE, "5") == NOW + 100
        store.run(store.plans.schedule({5: NOW + 200.5, 6: NOW + 49.5}))
        assert redis_client.zscore(DUE, "5") == NOW + 100
        assert redis_client.zscore(KEYS.user_due_key(6), "6") == NOW + 50
        store.run(store.plans.schedule({5: NOW + 10}))
        assert redis_client.zscore(DUE, "5") == NOW + 10

    def test_a_scheduled_user_is_claimed_at_the_time_not_before(self, store: PresenceStore) -> None:
        store.run(store.plans.schedule({uid(7): NOW + 10, uid(8): NOW + 9.5}))
        assert store.run(store.plans.claim_due(NOW + 9.4, 10)) == ([], [])
        assert store.run(store.plans.claim_due(NOW + 9.99, 10)) == (
            [],
            [],
        )  # 9.5 is due at its ceiling
        due, _ = store.run(store.plans.claim_due(NOW + 10, 10))
        assert sorted(map(str, due)) == sorted(map(str, [uid(7), uid(8)]))

    def test_schedule_of_nobody_costs_nothing(self, store: PresenceStore) -> None:
        plan = store.plans.schedule({})
        assert plan.commands == []
        with count_round_trips() as trips:
            assert store.run(plan) is True
        assert trips.count == 0

    def test_schedule_expiry(self, store: PresenceStore, redis_client: redis.Redis) -> None:
        assert store.run(store.plans.schedule_expiry(5, NOW + 60.5)) is True
        assert redis_client.zscore(EXPIRING, "5") == NOW + 61
        store.run(store.plans.schedule_expiry(5, NOW + 3600))
        assert redis_client.zscore(EXPIRING, "5") == NOW + 3601  # a new expiry replaces it
        store.run(store.plans.schedule_expiry(5, None))
        assert redis_client.zscore(EXPIRING, "5") is None

    @on_one_redis
    def test_prune_schedules_forgets_times_before_the_bound(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        redis_client.zadd(DUE, {"1": NOW - 1, "2": NOW, "3": NOW + 1})
        redis_client.zadd(EXPIRING, {"4": NOW - 100, "5": NOW})
        assert store.run(store.plans.prune_schedules(NOW + 0.5)) == 2
        assert redis_client.zrange(DUE, 0, -1) == ["2", "3"]
        assert redis_client.zrange(EXPIRING, 0, -1) == ["5"]
        assert store.run(store.plans.prune_schedules(NOW)) == 0

    @on_one_redis
    @override_settings(PRESENCE={"KEY_PREFIX": "site1", "BUCKETS": 10})
    def test_schedule_keys_share_one_hash_tag(self) -> None:
        store = get_store()
        assert store.keys.schedules() == [("site1:{live}:due", "site1:{live}:expiring")]
        assert store.keys.conns_key(store.keys.bucket_of(42)) == "site1:{2}:conns"


def _load_scripts(store: PresenceStore) -> None:
    """Load the scripts now, so a measured run needs no NOSCRIPT retry."""
    for script in (TOUCH, CONNECTION, CLAIM_DUE):
        store.client.script_load(script.source)


class TestMerge:
    def test_one_round_trip_each_plan_parsing_its_own_replies(self, store: PresenceStore) -> None:
        _load_scripts(store)
        plans: list[Plan[Any]] = [
            store.plans.touch(5, Device.WEB, NOW),
            store.plans.connection(6, "beat", NOW, "c1", device=Device.MOBILE),
            store.plans.read([5, 6, 7]),
            store.plans.claim_due(NOW - 1000, 10),
        ]
        merged = merge(plans)
        assert merged.commands == [command for plan in plans for command in plan.commands]
        with count_round_trips() as trips:
            results = store.run(merged)
        assert trips.count == 1
        assert results == [
            Transition(5, domain.LiveState(), domain.LiveState(NOW, (Device.WEB,))),
            Transition(
                6,
                domain.LiveState(),
                domain.LiveState(NOW, (Device.MOBILE,), connected=True),
                connections=1,
            ),
            # Commands run in order: the read sees both writes.
            {
                5: domain.LiveState(NOW, (Device.WEB,)),
                6: domain.LiveState(NOW, (Device.MOBILE,), connected=True),
            },
            ([], []),
        ]

    def test_many_users_expired_in_one_round_trip(self, store: PresenceStore) -> None:
        _load_scripts(store)
        for user_id in range(1, 21):
            conn(store, "beat", NOW, user_id=user_id)
        with count_round_trips() as trips:
            results = store.run(
                merge(
                    [store.plans.connection(uid, "expire", NOW + TTL + 1) for uid in range(1, 21)]
                )
            )
        assert trips.count == 1
        assert [(t.user_id, t.after.signed_off, t.connections) for t in results] == [
            (uid, True, 0) for uid in range(1, 21)
        ]

    def test_nothing_to_merge(self, store: PresenceStore) -> None:
        with count_round_trips() as trips:
            assert store.run(merge([])) == []
            assert store.run(merge([store.plans.schedule({}), store.plans.read([])])) == [True, {}]
        assert trips.count == 0

    def test_fallbacks(self, store: PresenceStore) -> None:
        lenient = merge(
            [
                store.plans.touch(5, Device.WEB, NOW),
                store.plans.claim_due(NOW, 1),
                store.plans.schedule({5: NOW}),
            ]
        )
        assert lenient.fallback == [None, ([], []), False]
        strict = merge([store.plans.read([5]), store.plans.prune_schedules(NOW)])
        assert strict.fallback is RAISE

    def test_outage(self, down_store: PresenceStore) -> None:
        lenient = [down_store.plans.connection(5, "beat", NOW), down_store.plans.claim_due(NOW, 1)]
        assert down_store.run(merge(lenient)) == [None, ([], [])]
        with pytest.raises(StoreUnavailable):
            down_store.run(merge([*lenient, down_store.plans.prune_schedules(NOW)]))


class TestTransition:
    def test_from_a_connection_reply(self) -> None:
        assert Transition.from_reply(5, [None, str(NOW * 32 + 16 + 1), 1]) == Transition(
            5,
            domain.LiveState(),
            domain.LiveState(last_active=NOW, devices=(Device.WEB,), connected=True),
            connections=1,
        )
        assert Transition.from_reply(5, [None, None, 0]) == Transition(
            5, domain.LiveState(), domain.LiveState(), connections=0
        )

    def test_from_a_touch_or_sign_off_reply(self) -> None:
        transition = Transition.from_reply(7, [str(NOW * 32 + 1), str(-(NOW * 32 + 8 + 2))])
        assert transition == Transition(
            7,
            domain.LiveState(last_active=NOW, devices=(Device.WEB,)),
            domain.LiveState(last_active=NOW, devices=(Device.MOBILE,), signed_off=True, idle=True),
            connections=None,
        )


class TestLiveOutage:
    def test_new_plans_fall_back(self, down_store: PresenceStore) -> None:
        assert down_store.run(down_store.plans.connection(5, "beat", NOW, "c1")) is None
        assert down_store.run(down_store.plans.connection(5, "close", NOW, "c1")) is None
        assert down_store.run(down_store.plans.connection(5, "expire", NOW)) is None
        assert down_store.run(down_store.plans.claim_due(NOW, 10)) == ([], [])
        assert down_store.run(down_store.plans.schedule({5: NOW})) is False
        assert down_store.run(down_store.plans.schedule_expiry(5, NOW)) is False
        assert down_store.run(down_store.plans.schedule_expiry(5, None)) is False
        with pytest.raises(StoreUnavailable):
            down_store.run(down_store.plans.prune_schedules(NOW))

    async def test_async_faces_fall_back(self, down_store: PresenceStore) -> None:
        assert await down_store.arun(down_store.plans.connection(5, "beat", NOW, "c1")) is None
        assert await down_store.arun(down_store.plans.claim_due(NOW, 10)) == ([], [])
        with pytest.raises(StoreUnavailable):
            await down_store.arun(down_store.plans.prune_schedules(NOW))


class TestAsyncConnection:
    async def test_same_script_through_the_async_face(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        try:
            first = await store.arun(store.plans.connection(5, "beat", NOW, "c1"))
            closed = await store.arun(store.plans.connection(5, "close", NOW + 3, "c1"))
        finally:
            await store.aclose()
        assert first == Transition(
            5,
            domain.LiveState(),
            domain.LiveState(last_active=NOW, devices=(Device.WEB,), connected=True),
            connections=1,
        )
        assert closed is not None
        assert closed.after == domain.LiveState(
            last_active=NOW + 3, devices=(Device.WEB,), signed_off=True
        )
        assert redis_client.zscore(DUE, "5") == NOW + 3 + GRACE_END

    @on_one_redis
    async def test_a_pooled_connection_redis_closed_is_replaced_at_once(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        # A restarted Redis (or a proxy's idle timeout) closes the pooled connections: the
        # next plan runs on a new one, once, with no outage declared and nothing lost.
        try:
            await store.arun(store.plans.connection(5, "beat", NOW, "c1"))
            kill_own_connections(redis_client)
            closed = await store.arun(store.plans.connection(5, "close", NOW + 3, "c1"))
            assert store.health.available()
            sync_read = live(store, 5)  # the sync face's pooled connection was closed too
        finally:
            await store.aclose()
        assert closed is not None and closed.after.signed_off
        assert sync_read.signed_off
        assert redis_client.zscore(DUE, "5") == NOW + 3 + GRACE_END


def kill_own_connections(redis_client: redis.Redis) -> None:
    """Redis closes this process's connections to it (as a restart does), not another
    process's (each xdist worker has a Redis of its own, but a live test's daphne processes
    share it): by the local ports of this process's sockets to Redis."""
    port = redis_client.connection_pool.connection_kwargs["port"]
    ports = {
        c.laddr.port
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port
    }
    own = str(redis_client.client_id())
    for client in redis_client.client_list():
        if int(client["addr"].rpartition(":")[2]) in ports and client["id"] != own:
            redis_client.client_kill_filter(_id=client["id"])


def test_a_heartbeat_keeps_the_devices_of_recent_page_requests(store: PresenceStore) -> None:
    store.run(store.plans.touch(5, Device.MOBILE, NOW))  # the phone loads a page
    transition = conn(store, "beat", NOW + 1, "c1", Device.WEB)  # a browser tab connects
    assert transition.after.devices == (Device.WEB, Device.MOBILE)


@pytest.mark.parametrize(
    ("after", "devices"),
    [(WINDOW - 1, (Device.WEB, Device.MOBILE)), (WINDOW, (Device.MOBILE,))],
)
def test_devices_of_a_request_last_for_exactly_the_online_window(
    store: PresenceStore, after: int, devices: tuple[Device, ...]
) -> None:
    # domain.live_status: online while now < last activity + ONLINE_WINDOW; at the window's
    # end the user was offline, so a new online stretch starts with the new device only.
    store.run(store.plans.touch(5, Device.WEB, NOW))
    store.run(store.plans.touch(5, Device.MOBILE, NOW + after))
    assert live(store, 5) == domain.LiveState(last_active=NOW + after, devices=devices)


def test_a_page_view_while_connected_adds_its_device_for_the_online_window(
    store: PresenceStore,
) -> None:
    conn(store, "beat", NOW, "c1", Device.WEB)
    store.run(store.plans.touch(5, Device.MOBILE, NOW + 1))  # the phone loads a page
    assert conn(store, "beat", NOW + 2, "c1", Device.WEB).after.devices == (
        Device.WEB,
        Device.MOBILE,
    )
    # The tab keeps beating; the phone's page view counts until the window has passed.
    for second in range(30, WINDOW + 1, 30):
        kept = conn(store, "beat", NOW + second, "c1", Device.WEB)
        assert kept.after.devices == (Device.WEB, Device.MOBILE)
    gone = conn(store, "beat", NOW + 1 + WINDOW, "c1", Device.WEB)
    assert gone.after.devices == (Device.WEB,)


def test_page_views_do_not_count_as_connections(store: PresenceStore) -> None:
    conn(store, "beat", NOW, "c1", Device.WEB)
    store.run(store.plans.touch(5, Device.MOBILE, NOW + 1))
    closed = conn(store, "close", NOW + 2, "c1", Device.WEB)
    # Closing the last connection signs the user off (docs/privacy.md), page views or not.
    assert closed.connections == 0
    assert closed.after.signed_off


class TestClusterKeyScheme:
    """The layout on a Redis Cluster (docs/redis-layout.md), built without connecting."""

    SCHEME = KeyScheme(PresenceSettings(REDIS_CLUSTER=("redis://127.0.0.1:7000",)))

    def test_a_users_keys_and_due_times_share_one_slot(self) -> None:
        for user_id in (1, 42, 16384 + 42, 999_999):
            bucket = self.SCHEME.bucket_of(user_id)
            keys = [
                self.SCHEME.seen_key(bucket),
                self.SCHEME.conns_key(bucket),
                self.SCHEME.expiries_key(bucket),
                self.SCHEME.user_due_key(user_id),
                self.SCHEME.user_expiring_key(user_id),
            ]
            assert len({key_slot(key.encode()) for key in keys}) == 1, keys

    def test_every_shard_has_its_schedules_and_their_slots_are_evenly_spaced(self) -> None:
        schedules = self.SCHEME.schedules()
        assert len(schedules) == 256
        slots = sorted(key_slot(due.encode()) for due, _ in schedules)
        # one shard in each 64-slot range: masters with equal slot ranges hold equal shares
        assert [slot // 64 for slot in slots] == list(range(256))

    def test_consecutive_shards_fall_far_apart(self) -> None:
        thirds = [key_slot(self.SCHEME.due_key(shard).encode()) * 3 // 16384 for shard in range(30)]
        assert all(a != b for a, b in itertools.pairwise(thirds))

    def test_tags_are_the_same_in_every_process(self) -> None:
        assert self.SCHEME.seen_key(42) == "presence:{" + shard_tags(256)[42] + "}:42:seen"
        assert (
            shard_tags(256)[:3]
            == KeyScheme(PresenceSettings(REDIS_CLUSTER=("redis://other:1",))).tags[:3]
        )


@on_one_redis
def test_a_beat_of_a_user_online_already_settles_the_ledger_in_one_command(
    store: PresenceStore, redis_client: Any
) -> None:
    """A user in the ledger's "online" set is not invisible (SET_INVISIBLE moves them), so a
    heartbeat moves their time there without asking; an invisible user's is settled as ever."""
    visible, hidden = uid(5), uid(6)
    store.run(store.plans.connection(visible, "open", NOW, "a"))
    store.run(store.plans.connection(hidden, "open", NOW, "b"))
    store.run(store.plans.set_invisible(hidden, True))
    redis_client.config_resetstat()
    beat = store.run(store.plans.connection(visible, "beat", NOW + 10, "a"))
    assert "cmdstat_sismember" not in redis_client.info("commandstats")
    assert beat is not None and (beat.made, beat.invisible) == (0, False)
    beat = store.run(store.plans.connection(hidden, "beat", NOW + 10, "b"))
    assert beat is not None and (beat.made, beat.invisible) == (0, True)
    online, hidden_set, _ = store.keys.ledger_keys(
        store.keys.shard_of(store.keys.bucket_of(visible))
    )
    until = NOW + 10 + 1 + store.conf.CONNECTION_TTL
    assert redis_client.zscore(online, member(5)) == until
    _, hidden_set, _ = store.keys.ledger_keys(store.keys.shard_of(store.keys.bucket_of(hidden)))
    assert redis_client.zscore(hidden_set, member(6)) == until


def test_the_scripts_declare_the_prior_set_among_their_keys(store: PresenceStore) -> None:
    """Every key a script touches is in its KEYS (a cluster routes by them; lua/prior.lua)."""
    user = uid(7)
    prior = store.keys.prior_key(store.keys.bucket_of(user))
    for plan in (
        store.plans.touch(user, Device.WEB, NOW),
        store.plans.sign_off(user, Device.WEB, NOW),
        store.plans.connection(user, "beat", NOW, "c"),
        store.plans.read_recent([user], NOW),
    ):
        assert prior in plan.commands[0][2]


def _closed_and_swept(store: PresenceStore, user: Any) -> Transition:
    """``user``'s one socket opened at NOW and closed at NOW + 10; a sweep at NOW + 20 (the
    grace over) made them offline: that transition."""
    store.run(store.plans.connection(user, "open", NOW, "a"))
    store.run(store.plans.connection(user, "close", NOW + 10, "a"))
    offline = store.run(store.plans.connection(user, "expire", NOW + 20))
    assert offline is not None and offline.made == -1
    return offline


def _coming_back(store: PresenceStore, user: Any, write: str, at: float) -> Plan[Any]:
    """A socket's open, or a page view's touch, of ``user`` at ``at``."""
    if write == "open":
        return store.plans.connection(user, "open", at, "b")
    return store.plans.touch(user, Device.WEB, at)


@pytest.mark.parametrize("write", ["open", "touch"])
def test_a_write_run_late_makes_the_user_online_no_earlier_than_their_offline(
    store: PresenceStore, write: str
) -> None:
    """A busy process takes its write's time, a sweep elsewhere makes the user offline (their
    grace ended meanwhile), then the write runs: its user_online comes no earlier than that
    user_offline, so the user's signals keep their order."""
    user = uid(9)
    offline = _closed_and_swept(store, user)
    assert offline.at == NOW + 10 + GRACE_END
    late = NOW + 10 + GRACE  # taken before the grace ended, run after the sweep
    online = store.run(_coming_back(store, user, write, late))
    assert online is not None and (online.made, online.at) == (1, offline.at)
    # A write in time keeps its own moment.
    other = uid(10)
    _closed_and_swept(store, other)
    in_time = NOW + 30
    again = store.run(_coming_back(store, other, write, in_time))
    assert again is not None and (again.made, again.at) == (1, in_time)


@pytest.mark.parametrize("late", ["close", "sign_off"])
def test_a_late_close_never_makes_the_user_online_again(store: PresenceStore, late: str) -> None:
    """A socket's close or a sign-off whose time was taken before a sweep elsewhere made the
    user offline (a busy process, its write under way while the grace ran out) lands after it:
    the user's score is what the sweep saw, so the user stays offline (no second user_online,
    no second user_offline)."""
    user = uid(11)
    _closed_and_swept(store, user)
    plan = (
        store.plans.connection(user, "close", NOW + 12, "a")
        if late == "close"
        else store.plans.sign_off(user, Device.WEB, NOW + 12)
    )
    written = store.run(plan)
    assert written is not None and written.made == 0
    assert store.run(store.plans.connection(user, "expire", NOW + 30)).made == 0


@on_one_redis
def test_a_read_begun_on_a_pooled_connection_redis_closed_is_sent_again(
    store: PresenceStore, redis_client: redis.Redis
) -> None:
    # As a plan run: a read sent early (store.begin, a page's read beside its database query)
    # takes a pooled connection that a restarted Redis closed: a new one replaces it before
    # anything is sent; no outage is declared and nothing is read offline.
    conn(store, "beat", NOW, "c1")  # (its connection back in the pool)
    kill_own_connections(redis_client)
    states = store.begin(store.plans.read([5]))()
    assert store.health.available()
    assert states is not None and states[5].connected


def test_threads_asking_a_new_store_for_its_client_at_once_share_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A client made by a thread and dropped closes its pool as it is collected: whatever had
    # used it (the closes listener's subscription) is cut off. Every thread is handed the one
    # client the store keeps. Making it is slowed down here, so that the threads ask while it
    # is being made.
    store = PresenceStore(get_settings())
    made: list[Any] = []
    if cluster_urls():
        original = nodes._RedisCluster

        class SlowCluster(original):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                time.sleep(0.05)
                super().__init__(*args, **kwargs)
                made.append(self)

        monkeypatch.setattr(nodes, "_RedisCluster", SlowCluster)
    else:
        where = store._connections.connection_kwargs

        def slowly() -> tuple[str, dict[str, Any]]:
            time.sleep(0.05)
            made.append(None)
            return where()

        monkeypatch.setattr(store._connections, "connection_kwargs", slowly)
    start = threading.Barrier(4)
    clients: list[object] = []

    def ask() -> None:
        start.wait(timeout=10)
        clients.append(store.client)

    threads = [threading.Thread(target=ask, daemon=True) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        assert not any(thread.is_alive() for thread in threads)
        assert len(made) > 1  # the threads did ask at once
        assert len(clients) == 4
        assert all(client is clients[0] for client in clients)
        assert store.client is clients[0]
    finally:
        store.close()
        for client in made:
            if client is not None:
                client.close()  # (the one handed out, closed again: nothing to do)
