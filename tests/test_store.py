"""The Redis store against a real Redis: key scheme, scripts, both faces, failure policy."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import time_machine
from django.test import override_settings
from redis.cluster import key_slot

from presence import domain
from presence.conf import PresenceSettings, get_settings
from presence.domain import Device
from presence.store import (
    CLAIM_DUE,
    CONNECTION,
    RAISE,
    READ_RECENT,
    SCORE_FACTOR,
    TOUCH,
    ConnectionOp,
    KeyScheme,
    Plan,
    PresenceStore,
    StaleEntry,
    StoreUnavailable,
    Transition,
    decode_score,
    get_store,
    merge,
)
from presence.store.keys import shard_tags
from presence.store.plans import READ_RECENT_KEYS
from tests.conftest import cluster_urls, on_one_redis
from tests.ids import member, uid
from tests.privacy_cases import count_round_trips

NOW = 1_800_000_000


@pytest.fixture
def store() -> PresenceStore:
    return get_store()


@pytest.fixture
def down_store(settings: object) -> Iterator[PresenceStore]:
    """A store pointed at a port where no Redis (or no cluster node) listens."""
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    presence = {"REDIS_CLUSTER": ["redis://127.0.0.1:1"]} if cluster_urls() else {}
    with override_settings(CACHES=caches, PRESENCE=presence):
        yield get_store()


def live(store: PresenceStore, user_id: Any) -> domain.LiveState:
    states = store.run(store.read([user_id]))
    assert states is not None
    return states.get(user_id, domain.LiveState())


@on_one_redis
class TestKeyScheme:
    def test_keys_carry_the_bucket_as_hash_tag(self, store: PresenceStore) -> None:
        assert store.seen_key(store.bucket_of(42)) == "presence:{42}:seen"
        assert store.bucket_of(16384 + 42) == 42
        # Everything one script touches is one key, so it is always in one cluster slot; two
        # users of one bucket share that slot.
        assert key_slot(store.seen_key(store.bucket_of(7)).encode()) == key_slot(b"{7}")
        assert {
            key_slot(key(store.bucket_of(7)).encode())
            for key in (store.seen_key, store.conns_key, store.expiries_key)
        } == {key_slot(b"{7}")}

    @override_settings(PRESENCE={"KEY_PREFIX": "site1", "BUCKETS": 10})
    def test_prefix_and_bucket_count_come_from_settings(self) -> None:
        store = get_store()
        assert store.seen_key(store.bucket_of(42)) == "site1:{2}:seen"

    @override_settings(PRESENCE={"BUCKETS": 10})
    def test_users_grouped_by_bucket_each_once(self) -> None:
        store = get_store()
        ids = [uid(n) for n in (3, 13, 23, 4, 7, 17)]
        grouped = store.by_bucket(ids)
        buckets = [bucket for bucket, _ in grouped]
        assert len(buckets) == len(set(buckets)) == len({store.bucket_of(u) for u in ids})
        assert sorted(u for _, members in grouped for u in members) == sorted(ids)
        assert all(store.bucket_of(u) == bucket for bucket, members in grouped for u in members)
        assert store.by_bucket([]) == []


class TestTouch:
    def test_records_time_and_device(self, store: PresenceStore, redis_client: redis.Redis) -> None:
        store.run(store.touch(5, Device.MOBILE, NOW + 0.7))
        assert live(store, 5) == domain.LiveState(last_active=NOW, devices=(Device.MOBILE,))
        assert redis_client.zscore(SEEN, "5") == NOW * SCORE_FACTOR + 2

    def test_never_moves_backwards(self, store: PresenceStore) -> None:
        store.run(store.touch(5, Device.WEB, NOW))
        store.run(store.touch(5, Device.WEB, NOW - 50))
        assert live(store, 5).last_active == NOW

    def test_devices_accumulate_within_the_online_window(self, store: PresenceStore) -> None:
        store.run(store.touch(5, Device.WEB, NOW))
        store.run(store.touch(5, Device.DESKTOP, NOW + 100))
        assert set(live(store, 5).devices) == {Device.WEB, Device.DESKTOP}

    def test_devices_restart_after_being_offline(self, store: PresenceStore) -> None:
        store.run(store.touch(5, Device.WEB, NOW))
        store.run(store.touch(5, Device.MOBILE, NOW + 301))
        assert live(store, 5).devices == (Device.MOBILE,)

    def test_reloads_scripts_after_script_flush(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        store.run(store.touch(5, Device.WEB, NOW))
        redis_client.script_flush()
        store.run(store.touch(6, Device.WEB, NOW))
        assert live(store, 6).last_active == NOW


class TestSignOff:
    def test_last_device_signs_off(self, store: PresenceStore) -> None:
        store.run(store.touch(5, Device.WEB, NOW))
        store.run(store.touch(5, Device.MOBILE, NOW + 1))
        store.run(store.sign_off(5, Device.WEB, NOW + 2))
        assert live(store, 5) == domain.LiveState(last_active=NOW + 2, devices=(Device.MOBILE,))
        store.run(store.sign_off(5, Device.MOBILE, NOW + 3))
        # The devices of the moment before are kept for the grace: nothing flaps meanwhile.
        assert live(store, 5) == domain.LiveState(
            last_active=NOW + 3, devices=(Device.MOBILE,), signed_off=True
        )

    def test_touch_after_sign_off_is_online_again(self, store: PresenceStore) -> None:
        store.run(store.sign_off(5, Device.WEB, NOW))
        store.run(store.touch(5, Device.WEB, NOW + 1))
        assert live(store, 5) == domain.LiveState(last_active=NOW + 1, devices=(Device.WEB,))

    def test_sign_off_of_unknown_user_records_last_seen(self, store: PresenceStore) -> None:
        store.run(store.sign_off(9, Device.WEB, NOW))
        assert live(store, 9) == domain.LiveState(last_active=NOW, signed_off=True)


class TestRead:
    def test_many_users_one_round_trip(self, store: PresenceStore) -> None:
        for user_id in (1, 2, 16385):  # 1 and 16385 share a bucket
            store.run(store.touch(user_id, Device.WEB, NOW + user_id % 7))
        plan = store.read([1, 2, 3, 16385])
        assert len(plan.commands) == 3  # one ZMSCORE per bucket, all in one pipeline
        states = store.run(plan)
        assert states is not None
        assert set(states) == {1, 2, 16385}
        assert states[16385].last_active == NOW + 16385 % 7

    def test_decode_score(self) -> None:
        assert decode_score(None) == domain.LiveState()
        assert decode_score(str(NOW * SCORE_FACTOR + 5)) == domain.LiveState(
            last_active=NOW, devices=(Device.WEB, Device.DESKTOP)
        )
        assert decode_score(str(NOW * SCORE_FACTOR + 16 + 8 + 2)) == domain.LiveState(
            last_active=NOW, devices=(Device.MOBILE,), connected=True, idle=True
        )
        assert decode_score(-(NOW * SCORE_FACTOR + 1)) == domain.LiveState(
            last_active=NOW, devices=(Device.WEB,), signed_off=True
        )


class TestReadRecent:
    """read_recent: the live state of those who may be live, the others left out."""

    def test_leaves_out_whoever_is_surely_offline(self, store: PresenceStore) -> None:
        since = NOW - 300
        store.run(store.touch(uid(1), Device.WEB, NOW))
        store.run(store.touch(uid(2), Device.MOBILE, since))  # at the bound: may be live
        store.run(store.touch(uid(3), Device.WEB, since - 1))
        store.run(store.sign_off(uid(4), Device.WEB, NOW - 2))  # within a grace: may be live
        store.run(store.sign_off(uid(5), Device.WEB, since - 10))
        ids = [uid(n) for n in range(1, 7)]  # uid(6) was never seen
        everything = store.run(store.read(ids))
        assert everything is not None and set(everything) == {uid(n) for n in range(1, 6)}
        recent = store.run(store.read_recent(ids, since))
        assert recent == {uid(n): everything[uid(n)] for n in (1, 2, 4)}
        assert recent[uid(4)].signed_off

    @on_one_redis
    def test_a_long_read_is_cut_into_scripts_sent_in_one_round_trip(
        self, store: PresenceStore
    ) -> None:
        ids = [uid(n) for n in range(1, 2 * READ_RECENT_KEYS + 2)]
        store.run(merge([store.touch(user_id, Device.WEB, NOW) for user_id in ids]))
        store.client.script_load(READ_RECENT.source)
        asked = [*ids, uid(10**6)]  # and one never seen
        plan = store.read_recent(asked, NOW - 300)
        buckets = {store.bucket_of(user_id) for user_id in asked}
        assert len(plan.commands) == -(-len(buckets) // READ_RECENT_KEYS) >= 2
        with count_round_trips() as trips:
            states = store.run(plan)
        assert trips.count == 1
        assert states is not None and set(states) == set(ids)

    @override_settings(PRESENCE={"BUCKETS": 1})
    def test_a_bucket_holding_more_members_than_lua_unpacks_at_once(
        self, store: PresenceStore
    ) -> None:
        store = get_store()  # the store of one bucket
        ids = [uid(n) for n in range(1, 4_102)]
        store.run(merge([store.touch(user_id, Device.WEB, NOW) for user_id in ids[::2]]))
        store.run(merge([store.touch(user_id, Device.WEB, NOW - 400) for user_id in ids[1::4]]))
        states = store.run(store.read_recent(ids, NOW - 300))
        assert states is not None and set(states) == set(ids[::2])  # not the old, not the absent

    @override_settings(PRESENCE={"BUCKETS": 16})
    def test_buckets_of_one_and_of_several_users_in_one_script(self, store: PresenceStore) -> None:
        store = get_store()  # 20 users in 16 buckets: some hold one, some several
        ids = [uid(n) for n in range(1, 21)]
        for n, user_id in enumerate(ids):
            store.run(store.touch(user_id, Device.WEB, NOW - (0 if n % 3 else 400)))
        sizes = {len(members) for _, members in store.by_bucket(ids)}
        assert max(sizes) > 1
        everything = store.run(store.read(ids))
        assert everything is not None
        recent = store.run(store.read_recent(ids, NOW - 300))
        assert recent == {u: s for u, s in everything.items() if s.last_active == NOW}
        assert len(recent) == 13

    async def test_async_face(self, store: PresenceStore) -> None:
        await store.arun(store.touch(uid(5), Device.WEB, NOW))
        await store.arun(store.touch(uid(6), Device.WEB, NOW - 1000))
        states = await store.arun(store.read_recent([uid(5), uid(6), uid(7)], NOW - 300))
        assert states == {uid(5): domain.LiveState(last_active=NOW, devices=(Device.WEB,))}
        await store.aclose()

    def test_outage_reads_unknown(self, down_store: PresenceStore) -> None:
        assert down_store.run(down_store.read_recent([uid(1)], NOW)) is None


class TestStale:
    # Ids of the site's pk type (tests.ids.uid): the scans read members back as pks.
    def test_scan_finds_only_entries_older_than_the_bound(self, store: PresenceStore) -> None:
        store.run(store.touch(uid(1), Device.WEB, NOW - 1000))
        store.run(store.touch(uid(2), Device.WEB, NOW))
        store.run(store.sign_off(uid(3), Device.WEB, NOW))  # signed off counts as stale
        buckets = sorted({store.bucket_of(uid(n)) for n in (1, 2, 3)})
        entries = store.run(store.scan_stale(buckets, before=NOW - 300))
        assert sorted((e.user_id, e.seen_at) for e in entries) == [
            (uid(1), NOW - 1000),
            (uid(3), NOW),
        ]

    def test_remove_keeps_entries_touched_since_the_scan(self, store: PresenceStore) -> None:
        store.run(store.touch(uid(1), Device.WEB, NOW - 1000))
        store.run(store.touch(uid(2), Device.WEB, NOW - 1000))
        buckets = sorted({store.bucket_of(uid(n)) for n in (1, 2)})
        entries = store.run(store.scan_stale(buckets, before=NOW - 300))
        store.run(store.touch(uid(2), Device.WEB, NOW))  # active again between scan and removal
        assert store.run(store.remove_unchanged(entries)) == 1
        assert live(store, uid(1)) == domain.LiveState()
        assert live(store, uid(2)).last_active == NOW

    def test_removing_twice_is_harmless(self, store: PresenceStore) -> None:
        store.run(store.touch(uid(1), Device.WEB, NOW - 1000))
        entries = store.run(store.scan_stale([store.bucket_of(uid(1))], before=NOW))
        assert store.run(store.remove_unchanged(entries)) == 1
        assert store.run(store.remove_unchanged(entries)) == 0

    def test_stale_entry_seen_at(self) -> None:
        assert StaleEntry(1, 1, str(-(NOW * SCORE_FACTOR + 1))).seen_at == NOW


class TestAsyncFace:
    async def test_same_results_as_sync(self, store: PresenceStore) -> None:
        await store.arun(store.touch(5, Device.WEB, NOW))
        await store.arun(store.touch(5, Device.MOBILE, NOW + 1))
        states = await store.arun(store.read([5, 6]))
        assert states == {
            5: domain.LiveState(last_active=NOW + 1, devices=(Device.WEB, Device.MOBILE))
        }
        await store.aclose()

    async def test_reloads_scripts_after_script_flush(
        self, store: PresenceStore, redis_url: str
    ) -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        await client.script_flush()
        await client.aclose()
        await store.arun(store.touch(8, Device.WEB, NOW))
        assert (await store.arun(store.read([8])) or {})[8].last_active == NOW
        await store.aclose()


class TestSlownessIsNotAnOutage:
    """A busy Redis (here: paused with CLIENT PAUSE) is waited for on the live paths and cut
    short on pages; neither declares an outage, so the others keep using Redis."""

    @staticmethod
    def pause(server: Any, milliseconds: int) -> None:
        client = redis.Redis.from_url(server.url)
        client.client_pause(milliseconds)
        client.close()

    async def test_a_live_call_waits_for_a_paused_redis_and_is_recorded(
        self, private_redis: Any, settings: Any
    ) -> None:
        settings.PRESENCE = {"SOCKET_TIMEOUT": 0.1, "LIVE_SOCKET_TIMEOUT": 5}
        store = get_store()
        await store.arun(store.read([1]), live=True)  # connected before the pause
        self.pause(private_redis, 600)
        transition = await store.arun(store.touch(1, Device.WEB, NOW), live=True)
        assert transition is not None and transition.after.last_active == NOW
        assert store.health.in_outage is False
        await store.aclose()

    async def test_live_calls_connecting_while_the_event_loop_is_stalled_are_recorded(
        self, private_redis: Any, settings: Any
    ) -> None:
        # A saturated process: its loop gets to new connections' handshakes later than
        # SOCKET_TIMEOUT, though Redis answered them at once. Slowness, not an outage.
        settings.PRESENCE = {"SOCKET_TIMEOUT": 0.05, "LIVE_SOCKET_TIMEOUT": 5}
        store = get_store()
        calls = [
            asyncio.ensure_future(store.arun(store.touch(uid, Device.WEB, NOW), live=True))
            for uid in range(1, 21)
        ]
        await asyncio.sleep(0)  # each call is on its way to a connection of its own
        time.sleep(0.2)  # the event loop stalls (a busy CPU), on purpose
        transitions = await asyncio.gather(*calls)
        assert [t is not None and t.after.last_active == NOW for t in transitions] == [True] * 20
        assert store.health.in_outage is False
        await store.aclose()

    async def test_live_calls_finding_every_pooled_connection_busy_declare_no_outage(
        self, private_redis: Any, settings: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        # More calls in flight than connections, each answered late: the pool's wait runs out
        # ("No connection available"). Redis answers; the others keep using it.
        caches = {alias: dict(conf) for alias, conf in settings.CACHES.items()}
        caches["default"]["OPTIONS"] = {"CONNECTION_POOL_KWARGS": {"max_connections": 1}}
        settings.CACHES = caches
        settings.PRESENCE = {"SOCKET_TIMEOUT": 0.05, "LIVE_SOCKET_TIMEOUT": 0.2}
        store = get_store()
        pool = store.async_client.connection_pool
        busy = await pool.get_connection()  # the only connection, held by a slow caller
        try:
            with caplog.at_level(logging.INFO, logger="presence"):
                late = await store.arun(store.touch(1, Device.WEB, NOW), live=True)
        finally:
            await pool.release(busy)
        assert late is None  # this call's fallback
        assert store.health.in_outage is False
        assert "every pooled connection busy" in caplog.text
        assert "unavailable" not in caplog.text
        transition = await store.arun(store.touch(2, Device.WEB, NOW), live=True)
        assert transition is not None and transition.after.last_active == NOW
        await store.aclose()

    async def test_a_page_gives_up_after_socket_timeout_without_an_outage(
        self, private_redis: Any, settings: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        settings.PRESENCE = {"SOCKET_TIMEOUT": 0.1, "LIVE_SOCKET_TIMEOUT": 5}
        store = get_store()
        await store.arun(store.read([1]), live=True)
        self.pause(private_redis, 600)
        with caplog.at_level(logging.WARNING, logger="presence"):
            assert await store.arun(store.read([1])) is None  # the page's fallback
            with pytest.raises(StoreUnavailable, match="too slow: no reply within SOCKET_TIMEOUT"):
                await store.arun(store.scan_stale([0], before=NOW))
        assert store.health.available() and not store.health.in_outage
        assert not [r for r in caplog.records if "unavailable" in r.getMessage()]
        # A live call meanwhile still waits for the pause to end and is recorded.
        transition = await store.arun(store.touch(2, Device.WEB, NOW), live=True)
        assert transition is not None and transition.after.last_active == NOW
        await store.aclose()

    def test_a_late_reply_to_a_sync_page_is_not_an_outage(
        self, private_redis: Any, settings: Any
    ) -> None:
        settings.PRESENCE = {"SOCKET_TIMEOUT": 0.1}
        store = get_store()
        store.run(store.read([1]))
        self.pause(private_redis, 600)
        assert store.run(store.read([1])) is None
        assert store.health.available() and not store.health.in_outage

    async def test_a_redis_that_stays_silent_past_live_socket_timeout_is_an_outage(
        self, private_redis: Any, settings: Any
    ) -> None:
        settings.PRESENCE = {"SOCKET_TIMEOUT": 0.1, "LIVE_SOCKET_TIMEOUT": 0.2}
        store = get_store()
        await store.arun(store.read([1]), live=True)
        self.pause(private_redis, 600)
        assert await store.arun(store.touch(1, Device.WEB, NOW), live=True) is None
        assert store.health.in_outage is True
        await store.aclose()


class TestRestartedRedis:
    """A restarted Redis closed every pooled connection: the next call uses a new one at once,
    records what it was asked to, and declares no outage."""

    def test_sync(self, private_redis: Any) -> None:
        store = get_store()
        store.run(store.read([1]))  # a pooled connection
        private_redis.stop()
        private_redis.start()
        transition = store.run(store.touch(1, Device.WEB, NOW))
        assert transition is not None and transition.after.last_active == NOW
        assert store.health.in_outage is False

    async def test_async(self, private_redis: Any) -> None:
        store = get_store()
        await store.arun(store.read([1]), live=True)
        private_redis.stop()
        private_redis.start()
        transition = await store.arun(store.touch(1, Device.WEB, NOW), live=True)
        assert transition is not None and transition.after.last_active == NOW
        assert store.health.in_outage is False
        await store.aclose()


class TestFailurePolicy:
    def test_outage_returns_fallbacks_and_logs_once(
        self, down_store: PresenceStore, caplog: pytest.LogCaptureFixture
    ) -> None:
        with (
            caplog.at_level(logging.WARNING, logger="presence"),
            time_machine.travel(NOW, tick=False) as clock,
        ):
            assert down_store.run(down_store.touch(1, Device.WEB, NOW)) is None
            assert down_store.run(down_store.read([1])) is None
            clock.shift(down_store.conf.RETRY_INTERVAL + 1)
            assert down_store.run(down_store.read([1])) is None  # retried, failed again
        warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
        assert len(warnings) == 1

    def test_outage_skips_redis_until_retry_interval(self, down_store: PresenceStore) -> None:
        with time_machine.travel(NOW, tick=False):
            down_store.run(down_store.read([1]))
            assert not down_store.health.available()
        with time_machine.travel(NOW + down_store.conf.RETRY_INTERVAL, tick=False):
            assert down_store.health.available()

    def test_strict_plans_raise(self, down_store: PresenceStore) -> None:
        with pytest.raises(StoreUnavailable, match="Redis is unavailable"):
            down_store.run(down_store.scan_stale([0], before=NOW))

    async def test_async_outage_returns_fallback(self, down_store: PresenceStore) -> None:
        assert await down_store.arun(down_store.read([1])) is None
        with pytest.raises(StoreUnavailable):
            await down_store.arun(down_store.scan_stale([0], before=NOW))

    @on_one_redis
    def test_misconfigured_location_is_reported(self) -> None:
        from django.core.exceptions import ImproperlyConfigured

        caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "nope"}}
        with (
            override_settings(CACHES=caches),
            pytest.raises(ImproperlyConfigured, match="redis://"),
        ):
            _ = get_store().client

    @on_one_redis
    def test_settings_change_rebuilds_the_store(self) -> None:
        before = get_store()
        with override_settings(PRESENCE={"ONLINE_WINDOW": 10}):
            assert get_store() is not before
            assert get_store().conf == PresenceSettings(ONLINE_WINDOW=10)


# --- live connections, schedules, merged plans ------------------------------------------------

# User 5's keys in this run's layout (one Redis, or the cluster run's shards).
KEYS = KeyScheme(get_settings())
SEEN = KEYS.seen_key(KEYS.bucket_of(5))
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
        store.connection(user_id, op, now, connection_id, device=device, idle=idle)
    )
    assert transition is not None
    return transition


def entries(redis_client: redis.Redis, user_id: int = 5) -> set[str]:
    """The user's connections, "id:device_bit:idle:connected_at:heartbeat"."""
    return set(get_store().run(get_store().describe_connections(user_id)))


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
        store.run(store.touch(6, Device.WEB, NOW))
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
        store.run(store.touch(5, Device.WEB, NOW + 10))
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
        store.run(store.touch(5, Device.MOBILE, NOW + after))
        assert redis_client.zscore(SEEN, "5") == score(NOW + after, 1 | 2, connected=False)
        assert live(store, 5) == domain.LiveState(
            last_active=NOW + after, devices=(Device.WEB, Device.MOBILE)
        )

    def test_logout_with_a_live_connection_stays_connected(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        conn(store, "beat", NOW, "c1", Device.WEB)
        transition = store.run(store.sign_off(5, Device.WEB, NOW + 10))
        assert transition is not None
        assert transition.after == domain.LiveState(
            last_active=NOW + 10, devices=(Device.WEB,), connected=True
        )
        assert redis_client.zscore(SEEN, "5") == score(NOW + 10, 1)
        assert redis_client.zscore(DUE, "5") == NOW + 10 + GRACE_END

    def test_logout_after_the_connection_ttl_signs_off(self, store: PresenceStore) -> None:
        conn(store, "beat", NOW, "c1", Device.WEB)
        transition = store.run(store.sign_off(5, Device.WEB, NOW + TTL_END))
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
        if op == "open":  # (a beat also sets the due time, to its TTL: see store.connection)
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
    def test_each_write_sets_when_the_user_turns_offline(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        def due() -> float | None:
            return redis_client.zscore(DUE, "5")

        store.run(store.touch(5, Device.WEB, NOW))
        assert due() == NOW + WINDOW
        store.run(store.touch(5, Device.WEB, NOW + 100))
        assert due() == NOW + WINDOW  # LT: a later time never replaces an earlier one
        conn(store, "beat", NOW + 110)
        assert due() == NOW + 110 + TTL_END
        store.run(store.touch(5, Device.WEB, NOW + 120))
        assert due() == NOW + 110 + TTL_END
        conn(store, "close", NOW + 130)
        assert due() == NOW + 130 + GRACE_END
        store.run(store.sign_off(5, Device.WEB, NOW + 140))
        assert due() == NOW + 140 + GRACE_END

    @on_one_redis
    def test_claim_due_hands_each_user_out_once(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        redis_client.zadd(DUE, {member(1): NOW - 10, member(2): NOW, member(3): NOW + 1})
        redis_client.zadd(EXPIRING, {member(4): NOW - 5, member(5): NOW + 10})
        assert store.run(store.claim_due(NOW + 0.9, 500)) == ([uid(1), uid(2)], [uid(4)])
        assert store.run(store.claim_due(NOW + 0.9, 500)) == ([], [])
        assert redis_client.zrange(DUE, 0, -1) == [member(3)]
        assert redis_client.zrange(EXPIRING, 0, -1) == [member(5)]
        assert store.run(store.claim_due(NOW + 10, 500)) == ([uid(3)], [uid(5)])

    @on_one_redis
    def test_claim_due_takes_the_earliest_up_to_the_limit(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        redis_client.zadd(DUE, {member(1): NOW - 1, member(2): NOW - 3, member(3): NOW - 2})
        assert store.run(store.claim_due(NOW, 2)) == ([uid(2), uid(3)], [])
        assert store.run(store.claim_due(NOW, 2)) == ([uid(1)], [])

    def test_schedule_keeps_an_earlier_time(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        # The ceiling: a user is never claimed before ``at`` (claims compare whole seconds), nor
        # a second later than needed (domain.offline_at gives whole seconds).
        assert store.run(store.schedule({5: NOW + 100})) is True
        assert redis_client.zscore(DUE, "5") == NOW + 100
        store.run(store.schedule({5: NOW + 200.5, 6: NOW + 49.5}))
        assert redis_client.zscore(DUE, "5") == NOW + 100
        assert redis_client.zscore(KEYS.user_due_key(6), "6") == NOW + 50
        store.run(store.schedule({5: NOW + 10}))
        assert redis_client.zscore(DUE, "5") == NOW + 10

    def test_a_scheduled_user_is_claimed_at_the_time_not_before(self, store: PresenceStore) -> None:
        store.run(store.schedule({uid(7): NOW + 10, uid(8): NOW + 9.5}))
        assert store.run(store.claim_due(NOW + 9.4, 10)) == ([], [])
        assert store.run(store.claim_due(NOW + 9.99, 10)) == ([], [])  # 9.5 is due at its ceiling
        due, _ = store.run(store.claim_due(NOW + 10, 10))
        assert sorted(map(str, due)) == sorted(map(str, [uid(7), uid(8)]))

    def test_schedule_of_nobody_costs_nothing(self, store: PresenceStore) -> None:
        plan = store.schedule({})
        assert plan.commands == []
        with count_round_trips() as trips:
            assert store.run(plan) is True
        assert trips.count == 0

    def test_schedule_expiry(self, store: PresenceStore, redis_client: redis.Redis) -> None:
        assert store.run(store.schedule_expiry(5, NOW + 60.5)) is True
        assert redis_client.zscore(EXPIRING, "5") == NOW + 61
        store.run(store.schedule_expiry(5, NOW + 3600))
        assert redis_client.zscore(EXPIRING, "5") == NOW + 3601  # a new expiry replaces it
        store.run(store.schedule_expiry(5, None))
        assert redis_client.zscore(EXPIRING, "5") is None

    @on_one_redis
    def test_prune_schedules_forgets_times_before_the_bound(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        redis_client.zadd(DUE, {"1": NOW - 1, "2": NOW, "3": NOW + 1})
        redis_client.zadd(EXPIRING, {"4": NOW - 100, "5": NOW})
        assert store.run(store.prune_schedules(NOW + 0.5)) == 2
        assert redis_client.zrange(DUE, 0, -1) == ["2", "3"]
        assert redis_client.zrange(EXPIRING, 0, -1) == ["5"]
        assert store.run(store.prune_schedules(NOW)) == 0

    @on_one_redis
    @override_settings(PRESENCE={"KEY_PREFIX": "site1", "BUCKETS": 10})
    def test_schedule_keys_share_one_hash_tag(self) -> None:
        store = get_store()
        assert store.schedules() == [("site1:{live}:due", "site1:{live}:expiring")]
        assert store.conns_key(store.bucket_of(42)) == "site1:{2}:conns"


def _load_scripts(store: PresenceStore) -> None:
    """Load the scripts now, so a measured run needs no NOSCRIPT retry."""
    for script in (TOUCH, CONNECTION, CLAIM_DUE):
        store.client.script_load(script.source)


class TestMerge:
    def test_one_round_trip_each_plan_parsing_its_own_replies(self, store: PresenceStore) -> None:
        _load_scripts(store)
        plans: list[Plan[Any]] = [
            store.touch(5, Device.WEB, NOW),
            store.connection(6, "beat", NOW, "c1", device=Device.MOBILE),
            store.read([5, 6, 7]),
            store.claim_due(NOW - 1000, 10),
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
                merge([store.connection(uid, "expire", NOW + TTL + 1) for uid in range(1, 21)])
            )
        assert trips.count == 1
        assert [(t.user_id, t.after.signed_off, t.connections) for t in results] == [
            (uid, True, 0) for uid in range(1, 21)
        ]

    def test_nothing_to_merge(self, store: PresenceStore) -> None:
        with count_round_trips() as trips:
            assert store.run(merge([])) == []
            assert store.run(merge([store.schedule({}), store.read([])])) == [True, {}]
        assert trips.count == 0

    def test_fallbacks(self, store: PresenceStore) -> None:
        lenient = merge(
            [store.touch(5, Device.WEB, NOW), store.claim_due(NOW, 1), store.schedule({5: NOW})]
        )
        assert lenient.fallback == [None, ([], []), False]
        strict = merge([store.read([5]), store.prune_schedules(NOW)])
        assert strict.fallback is RAISE

    def test_outage(self, down_store: PresenceStore) -> None:
        lenient = [down_store.connection(5, "beat", NOW), down_store.claim_due(NOW, 1)]
        assert down_store.run(merge(lenient)) == [None, ([], [])]
        with pytest.raises(StoreUnavailable):
            down_store.run(merge([*lenient, down_store.prune_schedules(NOW)]))


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
        assert down_store.run(down_store.connection(5, "beat", NOW, "c1")) is None
        assert down_store.run(down_store.connection(5, "close", NOW, "c1")) is None
        assert down_store.run(down_store.connection(5, "expire", NOW)) is None
        assert down_store.run(down_store.claim_due(NOW, 10)) == ([], [])
        assert down_store.run(down_store.schedule({5: NOW})) is False
        assert down_store.run(down_store.schedule_expiry(5, NOW)) is False
        assert down_store.run(down_store.schedule_expiry(5, None)) is False
        with pytest.raises(StoreUnavailable):
            down_store.run(down_store.prune_schedules(NOW))

    async def test_async_faces_fall_back(self, down_store: PresenceStore) -> None:
        assert await down_store.arun(down_store.connection(5, "beat", NOW, "c1")) is None
        assert await down_store.arun(down_store.claim_due(NOW, 10)) == ([], [])
        with pytest.raises(StoreUnavailable):
            await down_store.arun(down_store.prune_schedules(NOW))


class TestAsyncConnection:
    async def test_same_script_through_the_async_face(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        try:
            first = await store.arun(store.connection(5, "beat", NOW, "c1"))
            closed = await store.arun(store.connection(5, "close", NOW + 3, "c1"))
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


def test_a_heartbeat_keeps_the_devices_of_recent_page_requests(store: PresenceStore) -> None:
    store.run(store.touch(5, Device.MOBILE, NOW))  # the phone loads a page
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
    store.run(store.touch(5, Device.WEB, NOW))
    store.run(store.touch(5, Device.MOBILE, NOW + after))
    assert live(store, 5) == domain.LiveState(last_active=NOW + after, devices=devices)


def test_a_page_view_while_connected_adds_its_device_for_the_online_window(
    store: PresenceStore,
) -> None:
    conn(store, "beat", NOW, "c1", Device.WEB)
    store.run(store.touch(5, Device.MOBILE, NOW + 1))  # the phone loads a page
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
    store.run(store.touch(5, Device.MOBILE, NOW + 1))
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


# --- credentials never printed ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("redis://user:secret@host:1", "redis://user:***@host:1"),
        ("redis://:secret@host", "redis://***@host"),
        ("rediss://secret@host:6380/0", "rediss://***@host:6380/0"),
        ("redis://u:p@ss/w?rd#x@host:1/0", "redis://u:***@host:1/0"),
        ("redis://host:1/0?password=secret&db=1", "redis://host:1/0?password=***&db=1"),
        (
            "['redis://a:secret1@h1:1', 'redis://b:secret2@h2:2']",
            "['redis://a:***@h1:1', 'redis://b:***@h2:2']",
        ),
        ("redis://a:secret1@h1:1,redis://b:secret2@h2:2", "redis://a:***@h1:1,redis://b:***@h2:2"),
        (
            "Error connecting to redis://:secret@h:1. Refused.",
            "Error connecting to redis://***@h:1. Refused.",
        ),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("unix:///run/redis.sock?db=0", "unix:///run/redis.sock?db=0"),
        ("no url here: user@example.com", "no url here: user@example.com"),
    ],
)
def test_redact_url_keeps_where_and_drops_the_credentials(text: str, shown: str) -> None:
    from presence.store import redact_url

    assert redact_url(text) == shown


def test_an_outage_log_line_and_error_never_carry_a_password(
    down_store: PresenceStore, caplog: pytest.LogCaptureFixture
) -> None:
    # redis-py's errors may quote what they were given; presence prints them redacted.
    error = redis.exceptions.ConnectionError("Error connecting to redis://:secret@10.0.0.1:1.")
    with caplog.at_level(logging.INFO, logger="presence"):
        down_store.health.failed(error, 1.0)
        with pytest.raises(StoreUnavailable) as raised:
            down_store._fallback(down_store.scan_stale([0], before=NOW), error)
    assert "secret" not in caplog.text and "10.0.0.1" in caplog.text
    assert "secret" not in str(raised.value) and "10.0.0.1" in str(raised.value)
