"""The Redis store against a real Redis: key scheme, scripts, both faces, failure policy."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import redis
import time_machine
from django.test import override_settings
from redis.cluster import key_slot

from presence import domain
from presence.conf import PresenceSettings
from presence.domain import Device
from presence.store import (
    SCORE_FACTOR,
    PresenceStore,
    StaleEntry,
    StoreUnavailable,
    decode_score,
    get_store,
)

NOW = 1_800_000_000


@pytest.fixture
def store() -> PresenceStore:
    return get_store()


@pytest.fixture
def down_store(settings: object) -> Iterator[PresenceStore]:
    """A store pointed at a port where no Redis listens."""
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    with override_settings(CACHES=caches):
        yield get_store()


def live(store: PresenceStore, user_id: int) -> domain.LiveState:
    states = store.run(store.read([user_id]))
    assert states is not None
    return states.get(user_id, domain.LiveState())


class TestKeyScheme:
    def test_keys_carry_the_bucket_as_hash_tag(self, store: PresenceStore) -> None:
        assert store.seen_key(store.bucket_of(42)) == "presence:{42}:seen"
        assert store.bucket_of(16384 + 42) == 42
        # Everything one script touches is one key, so it is always in one cluster slot; two
        # users of one bucket share that slot.
        assert key_slot(store.seen_key(store.bucket_of(7)).encode()) == key_slot(b"{7}")

    @override_settings(PRESENCE={"KEY_PREFIX": "site1", "BUCKETS": 10})
    def test_prefix_and_bucket_count_come_from_settings(self) -> None:
        store = get_store()
        assert store.seen_key(store.bucket_of(42)) == "site1:{2}:seen"


class TestTouch:
    def test_records_time_and_device(self, store: PresenceStore, redis_client: redis.Redis) -> None:
        store.run(store.touch(5, Device.MOBILE, NOW + 0.7))
        assert live(store, 5) == domain.LiveState(last_active=NOW, devices=(Device.MOBILE,))
        assert redis_client.zscore("presence:{5}:seen", "5") == NOW * SCORE_FACTOR + 2

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


class TestStale:
    def test_scan_finds_only_entries_older_than_the_bound(self, store: PresenceStore) -> None:
        store.run(store.touch(1, Device.WEB, NOW - 1000))
        store.run(store.touch(2, Device.WEB, NOW))
        store.run(store.sign_off(3, Device.WEB, NOW))  # signed off counts as stale
        entries = store.run(store.scan_stale([1, 2, 3], before=NOW - 300))
        assert sorted((e.user_id, e.seen_at) for e in entries) == [(1, NOW - 1000), (3, NOW)]

    def test_remove_keeps_entries_touched_since_the_scan(self, store: PresenceStore) -> None:
        store.run(store.touch(1, Device.WEB, NOW - 1000))
        store.run(store.touch(2, Device.WEB, NOW - 1000))
        entries = store.run(store.scan_stale([1, 2], before=NOW - 300))
        store.run(store.touch(2, Device.WEB, NOW))  # active again between scan and removal
        assert store.run(store.remove_unchanged(entries)) == 1
        assert live(store, 1) == domain.LiveState()
        assert live(store, 2).last_active == NOW

    def test_removing_twice_is_harmless(self, store: PresenceStore) -> None:
        store.run(store.touch(1, Device.WEB, NOW - 1000))
        entries = store.run(store.scan_stale([1], before=NOW))
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

    def test_misconfigured_location_is_reported(self) -> None:
        from django.core.exceptions import ImproperlyConfigured

        caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "nope"}}
        with (
            override_settings(CACHES=caches),
            pytest.raises(ImproperlyConfigured, match="redis://"),
        ):
            _ = get_store().client

    def test_settings_change_rebuilds_the_store(self) -> None:
        before = get_store()
        with override_settings(PRESENCE={"ONLINE_WINDOW": 10}):
            assert get_store() is not before
            assert get_store().conf == PresenceSettings(ONLINE_WINDOW=10)
