"""The Redis store against a real Redis: key scheme, scripts, both faces, failure policy.

Live connections, schedules and merged plans: tests/store/test_store_connections.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import time_machine
from django.test import override_settings
from redis.cluster import key_slot

from presence import domain
from presence.conf import PresenceSettings
from presence.domain import Device
from presence.store import (
    READ_RECENT,
    SCORE_FACTOR,
    PresenceStore,
    StaleEntry,
    StoreUnavailable,
    decode_score,
    get_store,
    merge,
)
from presence.store.plans import RAISE, READ_RECENT_KEYS, Plan, script_call
from presence.store.scripts import Script
from tests.conftest import cluster_urls, on_one_redis
from tests.ids import uid
from tests.privacy_cases import count_round_trips
from tests.store.stores import NOW, SEEN, live
from tests.store.stores import down_store as down_store
from tests.store.stores import store as store

pytestmark = [pytest.mark.uuid_site, pytest.mark.cluster]


@on_one_redis
class TestKeyScheme:
    def test_keys_carry_the_bucket_as_hash_tag(self, store: PresenceStore) -> None:
        assert store.keys.seen_key(store.keys.bucket_of(42)) == "presence:{42}:seen"
        assert store.keys.bucket_of(16384 + 42) == 42
        # Everything one script touches is one key, so it is always in one cluster slot; two
        # users of one bucket share that slot.
        assert key_slot(store.keys.seen_key(store.keys.bucket_of(7)).encode()) == key_slot(b"{7}")
        assert {
            key_slot(key(store.keys.bucket_of(7)).encode())
            for key in (store.keys.seen_key, store.keys.conns_key, store.keys.expiries_key)
        } == {key_slot(b"{7}")}

    @override_settings(PRESENCE={"KEY_PREFIX": "site1", "BUCKETS": 10})
    def test_prefix_and_bucket_count_come_from_settings(self) -> None:
        store = get_store()
        assert store.keys.seen_key(store.keys.bucket_of(42)) == "site1:{2}:seen"

    @override_settings(PRESENCE={"BUCKETS": 10})
    def test_users_grouped_by_bucket_each_once(self) -> None:
        store = get_store()
        ids = [uid(n) for n in (3, 13, 23, 4, 7, 17)]
        grouped = store.keys.by_bucket(ids)
        buckets = [bucket for bucket, _ in grouped]
        assert len(buckets) == len(set(buckets)) == len({store.keys.bucket_of(u) for u in ids})
        assert sorted(u for _, members in grouped for u in members) == sorted(ids)
        assert all(
            store.keys.bucket_of(u) == bucket for bucket, members in grouped for u in members
        )
        assert store.keys.by_bucket([]) == []


class TestTouch:
    def test_records_time_and_device(self, store: PresenceStore, redis_client: redis.Redis) -> None:
        store.run(store.plans.touch(5, Device.MOBILE, NOW + 0.7))
        assert live(store, 5) == domain.LiveState(last_active=NOW, devices=(Device.MOBILE,))
        assert redis_client.zscore(SEEN, "5") == NOW * SCORE_FACTOR + 2

    def test_never_moves_backwards(self, store: PresenceStore) -> None:
        store.run(store.plans.touch(5, Device.WEB, NOW))
        store.run(store.plans.touch(5, Device.WEB, NOW - 50))
        assert live(store, 5).last_active == NOW

    def test_devices_accumulate_within_the_online_window(self, store: PresenceStore) -> None:
        store.run(store.plans.touch(5, Device.WEB, NOW))
        store.run(store.plans.touch(5, Device.DESKTOP, NOW + 100))
        assert set(live(store, 5).devices) == {Device.WEB, Device.DESKTOP}

    def test_devices_restart_after_being_offline(self, store: PresenceStore) -> None:
        store.run(store.plans.touch(5, Device.WEB, NOW))
        store.run(store.plans.touch(5, Device.MOBILE, NOW + 301))
        assert live(store, 5).devices == (Device.MOBILE,)

    def test_reloads_scripts_after_script_flush(
        self, store: PresenceStore, redis_client: redis.Redis
    ) -> None:
        store.run(store.plans.touch(5, Device.WEB, NOW))
        redis_client.script_flush()
        store.run(store.plans.touch(6, Device.WEB, NOW))
        assert live(store, 6).last_active == NOW


class TestSignOff:
    def test_last_device_signs_off(self, store: PresenceStore) -> None:
        store.run(store.plans.touch(5, Device.WEB, NOW))
        store.run(store.plans.touch(5, Device.MOBILE, NOW + 1))
        store.run(store.plans.sign_off(5, Device.WEB, NOW + 2))
        assert live(store, 5) == domain.LiveState(last_active=NOW + 2, devices=(Device.MOBILE,))
        store.run(store.plans.sign_off(5, Device.MOBILE, NOW + 3))
        # The devices of the moment before are kept for the grace: nothing flaps meanwhile.
        assert live(store, 5) == domain.LiveState(
            last_active=NOW + 3, devices=(Device.MOBILE,), signed_off=True
        )

    def test_touch_after_sign_off_is_online_again(self, store: PresenceStore) -> None:
        store.run(store.plans.sign_off(5, Device.WEB, NOW))
        store.run(store.plans.touch(5, Device.WEB, NOW + 1))
        assert live(store, 5) == domain.LiveState(last_active=NOW + 1, devices=(Device.WEB,))

    def test_sign_off_of_unknown_user_records_last_seen(self, store: PresenceStore) -> None:
        store.run(store.plans.sign_off(9, Device.WEB, NOW))
        assert live(store, 9) == domain.LiveState(last_active=NOW, signed_off=True)


class TestRead:
    def test_many_users_one_round_trip(self, store: PresenceStore) -> None:
        for user_id in (1, 2, 16385):  # 1 and 16385 share a bucket
            store.run(store.plans.touch(user_id, Device.WEB, NOW + user_id % 7))
        plan = store.plans.read([1, 2, 3, 16385])
        # One ZMSCORE per bucket and one of its prior set (the last seen before today's), all
        # in one pipeline.
        assert len(plan.commands) == 6
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
        store.run(store.plans.touch(uid(1), Device.WEB, NOW))
        store.run(store.plans.touch(uid(2), Device.MOBILE, since))  # at the bound: may be live
        store.run(store.plans.touch(uid(3), Device.WEB, since - 1))
        store.run(store.plans.sign_off(uid(4), Device.WEB, NOW - 2))  # within a grace: may be live
        store.run(store.plans.sign_off(uid(5), Device.WEB, since - 10))
        ids = [uid(n) for n in range(1, 7)]  # uid(6) was never seen
        everything = store.run(store.plans.read(ids))
        assert everything is not None and set(everything) == {uid(n) for n in range(1, 6)}
        recent = store.run(store.plans.read_recent(ids, since))
        assert recent == {uid(n): everything[uid(n)] for n in (1, 2, 4)}
        assert recent[uid(4)].signed_off

    @on_one_redis
    def test_a_long_read_is_cut_into_scripts_sent_in_one_round_trip(
        self, store: PresenceStore
    ) -> None:
        ids = [uid(n) for n in range(1, 2 * READ_RECENT_KEYS + 2)]
        store.run(merge([store.plans.touch(user_id, Device.WEB, NOW) for user_id in ids]))
        store.client.script_load(READ_RECENT.source)
        asked = [*ids, uid(10**6)]  # and one never seen
        plan = store.plans.read_recent(asked, NOW - 300)
        buckets = {store.keys.bucket_of(user_id) for user_id in asked}
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
        store.run(merge([store.plans.touch(user_id, Device.WEB, NOW) for user_id in ids[::2]]))
        store.run(
            merge([store.plans.touch(user_id, Device.WEB, NOW - 400) for user_id in ids[1::4]])
        )
        states = store.run(store.plans.read_recent(ids, NOW - 300))
        assert states is not None and set(states) == set(ids[::2])  # not the old, not the absent

    @override_settings(PRESENCE={"BUCKETS": 16})
    def test_buckets_of_one_and_of_several_users_in_one_script(self, store: PresenceStore) -> None:
        store = get_store()  # 20 users in 16 buckets: some hold one, some several
        ids = [uid(n) for n in range(1, 21)]
        for n, user_id in enumerate(ids):
            store.run(store.plans.touch(user_id, Device.WEB, NOW - (0 if n % 3 else 400)))
        sizes = {len(members) for _, members in store.keys.by_bucket(ids)}
        assert max(sizes) > 1
        everything = store.run(store.plans.read(ids))
        assert everything is not None
        recent = store.run(store.plans.read_recent(ids, NOW - 300))
        assert recent == {u: s for u, s in everything.items() if s.last_active == NOW}
        assert len(recent) == 13

    async def test_async_face(self, store: PresenceStore) -> None:
        await store.arun(store.plans.touch(uid(5), Device.WEB, NOW))
        await store.arun(store.plans.touch(uid(6), Device.WEB, NOW - 1000))
        states = await store.arun(store.plans.read_recent([uid(5), uid(6), uid(7)], NOW - 300))
        assert states == {uid(5): domain.LiveState(last_active=NOW, devices=(Device.WEB,))}
        await store.aclose()

    def test_outage_reads_unknown(self, down_store: PresenceStore) -> None:
        assert down_store.run(down_store.plans.read_recent([uid(1)], NOW)) is None


class TestStale:
    # Ids of the site's pk type (tests.ids.uid): the scans read members back as pks.
    def test_scan_finds_only_entries_older_than_the_bound(self, store: PresenceStore) -> None:
        store.run(store.plans.touch(uid(1), Device.WEB, NOW - 1000))
        store.run(store.plans.touch(uid(2), Device.WEB, NOW))
        store.run(store.plans.sign_off(uid(3), Device.WEB, NOW))  # signed off counts as stale
        buckets = sorted({store.keys.bucket_of(uid(n)) for n in (1, 2, 3)})
        entries = store.run(store.plans.scan_stale(buckets, before=NOW - 300))
        assert sorted((e.user_id, e.seen_at) for e in entries) == [
            (uid(1), NOW - 1000),
            (uid(3), NOW),
        ]

    def test_remove_keeps_entries_touched_since_the_scan(self, store: PresenceStore) -> None:
        store.run(store.plans.touch(uid(1), Device.WEB, NOW - 1000))
        store.run(store.plans.touch(uid(2), Device.WEB, NOW - 1000))
        buckets = sorted({store.keys.bucket_of(uid(n)) for n in (1, 2)})
        entries = store.run(store.plans.scan_stale(buckets, before=NOW - 300))
        store.run(
            store.plans.touch(uid(2), Device.WEB, NOW)
        )  # active again between scan and removal
        assert store.run(store.plans.remove_unchanged(entries, NOW)) == 1
        assert live(store, uid(1)) == domain.LiveState()
        assert live(store, uid(2)).last_active == NOW

    def test_removing_twice_is_harmless(self, store: PresenceStore) -> None:
        store.run(store.plans.touch(uid(1), Device.WEB, NOW - 1000))
        entries = store.run(store.plans.scan_stale([store.keys.bucket_of(uid(1))], before=NOW))
        assert store.run(store.plans.remove_unchanged(entries, NOW)) == 1
        assert store.run(store.plans.remove_unchanged(entries, NOW)) == 0

    def test_stale_entry_seen_at(self) -> None:
        assert StaleEntry(1, 1, str(-(NOW * SCORE_FACTOR + 1))).seen_at == NOW


class TestAsyncFace:
    async def test_same_results_as_sync(self, store: PresenceStore) -> None:
        await store.arun(store.plans.touch(5, Device.WEB, NOW))
        await store.arun(store.plans.touch(5, Device.MOBILE, NOW + 1))
        states = await store.arun(store.plans.read([5, 6]))
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
        await store.arun(store.plans.touch(8, Device.WEB, NOW))
        assert (await store.arun(store.plans.read([8])) or {})[8].last_active == NOW
        await store.aclose()


@contextlib.contextmanager
def unreachable_port() -> Iterator[int]:
    """A port on 127.0.0.1 whose listener's accept queue is full: a new connection is neither
    refused nor made (its SYN dropped), as with a host that went away."""
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


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
        await store.arun(store.plans.read([1]), live=True)  # connected before the pause
        self.pause(private_redis, 600)
        transition = await store.arun(store.plans.touch(1, Device.WEB, NOW), live=True)
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
            asyncio.ensure_future(store.arun(store.plans.touch(uid, Device.WEB, NOW), live=True))
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
                late = await store.arun(store.plans.touch(1, Device.WEB, NOW), live=True)
        finally:
            await pool.release(busy)
        assert late is None  # this call's fallback
        assert store.health.in_outage is False
        assert "every pooled connection busy" in caplog.text
        assert "unavailable" not in caplog.text
        transition = await store.arun(store.plans.touch(2, Device.WEB, NOW), live=True)
        assert transition is not None and transition.after.last_active == NOW
        await store.aclose()

    async def test_a_page_gives_up_after_socket_timeout_without_an_outage(
        self, private_redis: Any, settings: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        settings.PRESENCE = {"SOCKET_TIMEOUT": 0.1, "LIVE_SOCKET_TIMEOUT": 5}
        store = get_store()
        await store.arun(store.plans.read([1]), live=True)
        self.pause(private_redis, 600)
        with caplog.at_level(logging.WARNING, logger="presence"):
            assert await store.arun(store.plans.read([1])) is None  # the page's fallback
            with pytest.raises(StoreUnavailable, match="too slow: no reply within SOCKET_TIMEOUT"):
                await store.arun(store.plans.scan_stale([0], before=NOW))
        assert store.health.available() and not store.health.in_outage
        assert not [r for r in caplog.records if "unavailable" in r.getMessage()]
        # A live call meanwhile still waits for the pause to end and is recorded.
        transition = await store.arun(store.plans.touch(2, Device.WEB, NOW), live=True)
        assert transition is not None and transition.after.last_active == NOW
        await store.aclose()

    def test_a_late_reply_to_a_sync_page_is_not_an_outage(
        self, private_redis: Any, settings: Any
    ) -> None:
        settings.PRESENCE = {"SOCKET_TIMEOUT": 0.1}
        store = get_store()
        store.run(store.plans.read([1]))
        self.pause(private_redis, 600)
        assert store.run(store.plans.read([1])) is None
        assert store.health.available() and not store.health.in_outage

    async def test_an_async_page_cut_short_by_a_redis_it_cannot_reach_starts_an_outage(
        self, settings: Any, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A page's call gives up after SOCKET_TIMEOUT, sooner than a connection is given up
        on (LIVE_SOCKET_TIMEOUT, for a busy process): a Redis that cannot be reached at all
        is still an outage, found by one live PING, and the pages after it are answered at
        once without waiting."""
        if cluster_urls():
            pytest.skip("one Redis's outage; each cluster master's health is its own")
        with unreachable_port() as port:
            caches = {alias: dict(conf) for alias, conf in settings.CACHES.items()}
            caches["default"]["LOCATION"] = f"redis://127.0.0.1:{port}/0"
            settings.CACHES = caches
            settings.PRESENCE = {"SOCKET_TIMEOUT": 0.1, "LIVE_SOCKET_TIMEOUT": 0.3}
            store = get_store()
            with caplog.at_level(logging.INFO, logger="presence"):
                assert await store.arun(store.plans.read([1])) is None  # late: its fallback
                for _ in range(40):  # bounded: the PING gives up after LIVE_SOCKET_TIMEOUT
                    if store.known_down():
                        break
                    await asyncio.sleep(0.05)
                assert store.known_down() and store.health.in_outage
                started = time.perf_counter()
                assert await store.arun(store.plans.read([1])) is None
                assert time.perf_counter() - started < 0.05  # answered at once
            assert sum("unavailable" in r.getMessage() for r in caplog.records) == 1
            await store.aclose()

    async def test_a_redis_that_stays_silent_past_live_socket_timeout_is_an_outage(
        self, private_redis: Any, settings: Any
    ) -> None:
        settings.PRESENCE = {"SOCKET_TIMEOUT": 0.1, "LIVE_SOCKET_TIMEOUT": 0.2}
        store = get_store()
        await store.arun(store.plans.read([1]), live=True)
        self.pause(private_redis, 600)
        assert await store.arun(store.plans.touch(1, Device.WEB, NOW), live=True) is None
        assert store.health.in_outage is True
        await store.aclose()


def lost(lua: str) -> Script:
    """A script Redis does not know, as one it lost (a restart, a failover, SCRIPT FLUSH) while
    it kept others: its text made unique."""
    return Script(f"{lua}\n-- {uuid.uuid4()}\n")


#: two keys of one slot (one master on a cluster: Redis runs their commands in the plan's order)
COUNTED, PLAIN = "presence-test:{lost}:counted", "presence-test:{lost}:plain"


def written_then_read() -> Plan[list[Any]]:
    """A write by a script Redis lost, a write Redis runs (a plain command), then reads of both."""
    count = lost("return redis.call('INCR', KEYS[1])")
    return Plan(
        commands=[
            script_call(count, [COUNTED], []),
            ("INCR", PLAIN),
            ("GET", COUNTED),
            ("GET", PLAIN),
        ],
        parse=lambda replies: [int(reply) for reply in replies],
        fallback=RAISE,
    )


class TestScriptsRedisLost:
    """A plan whose script Redis lost (the others' known: another process loaded them since):
    its reads after the refused command read its writes, and no write runs twice."""

    def test_sync(self, store: PresenceStore, redis_client: Any) -> None:
        assert store.run(written_then_read()) == [1, 1, 1, 1]
        assert (redis_client.get(COUNTED), redis_client.get(PLAIN)) == ("1", "1")

    @pytest.mark.parametrize("live", [True, False], ids=["live", "page"])
    async def test_async(self, store: PresenceStore, redis_client: Any, live: bool) -> None:
        assert await store.arun(written_then_read(), live=live) == [1, 1, 1, 1]
        assert (redis_client.get(COUNTED), redis_client.get(PLAIN)) == ("1", "1")
        await store.aclose()


class TestRestartedRedis:
    """A restarted Redis closed every pooled connection: the next call uses a new one at once,
    records what it was asked to, and declares no outage."""

    def test_sync(self, private_redis: Any) -> None:
        store = get_store()
        store.run(store.plans.read([1]))  # a pooled connection
        private_redis.stop()
        private_redis.start()
        transition = store.run(store.plans.touch(1, Device.WEB, NOW))
        assert transition is not None and transition.after.last_active == NOW
        assert store.health.in_outage is False

    async def test_async(self, private_redis: Any) -> None:
        store = get_store()
        await store.arun(store.plans.read([1]), live=True)
        private_redis.stop()
        private_redis.start()
        transition = await store.arun(store.plans.touch(1, Device.WEB, NOW), live=True)
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
            assert down_store.run(down_store.plans.touch(1, Device.WEB, NOW)) is None
            assert down_store.run(down_store.plans.read([1])) is None
            clock.shift(down_store.conf.RETRY_INTERVAL + 1)
            assert down_store.run(down_store.plans.read([1])) is None  # retried, failed again
        warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
        assert len(warnings) == 1

    def test_outage_skips_redis_until_retry_interval(self, down_store: PresenceStore) -> None:
        with time_machine.travel(NOW, tick=False):
            down_store.run(down_store.plans.read([1]))
            assert not down_store.health.available()
        with time_machine.travel(NOW + down_store.conf.RETRY_INTERVAL, tick=False):
            assert down_store.health.available()

    def test_a_clock_stepped_back_during_an_outage_does_not_stretch_it(
        self, private_redis: Any
    ) -> None:
        # NTP steps the clock an hour back while Redis is down: once Redis is back, presence
        # uses it within RETRY_INTERVAL, not an hour later.
        store = get_store()
        with time_machine.travel(NOW, tick=False) as clock:
            private_redis.stop()
            assert store.run(store.plans.touch(1, Device.WEB, NOW)) is None
            assert store.health.in_outage is True
            private_redis.start()
            clock.shift(-3600)
            transition = store.run(store.plans.touch(1, Device.WEB, NOW - 3600))
        assert transition is not None and transition.after.last_active == NOW - 3600
        assert store.health.in_outage is False

    def test_strict_plans_raise(self, down_store: PresenceStore) -> None:
        with pytest.raises(StoreUnavailable, match="Redis is unavailable"):
            down_store.run(down_store.plans.scan_stale([0], before=NOW))

    async def test_async_outage_returns_fallback(self, down_store: PresenceStore) -> None:
        assert await down_store.arun(down_store.plans.read([1])) is None
        with pytest.raises(StoreUnavailable):
            await down_store.arun(down_store.plans.scan_stale([0], before=NOW))

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
            down_store._fallback(down_store.plans.scan_stale([0], before=NOW), error)
    assert "secret" not in caplog.text and "10.0.0.1" in caplog.text
    assert "secret" not in str(raised.value) and "10.0.0.1" in str(raised.value)
