"""manage.py presence_cleanup against a real Redis and the database."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
import redis
import time_machine
from django.core.management import CommandError, call_command
from django.db import connection

from presence import api
from presence.conf import get_settings
from presence.domain import Device, Status
from presence.models import Contact, LastSeen, UserStatus
from presence.store import RAISE, REMOVE_IF_UNCHANGED, Plan, StoreUnavailable, get_store
from tests.clock import T0, at
from tests.ids import redis_member

pytestmark = [pytest.mark.uuid_site, pytest.mark.cluster]


def cleanup(*args: str) -> str:
    out = StringIO()
    call_command("presence_cleanup", *args, stdout=out)
    return out.getvalue()


def counts(output: str) -> dict[str, int]:
    """The numbers the command reports, by what they count."""
    patterns = {
        "buckets": r"(\d+) buckets",
        "stale": r"(\d+) stale entries",
        "persisted": r"(\d+) last seen times persisted",
        "removed": r"(\d+) removed",
        "expired": r"(\d+) expired custom statuses",
    }
    found = {}
    for name, pattern in patterns.items():
        match = re.search(pattern, output)
        if match:
            found[name] = int(match.group(1))
    return found


def in_redis(user: Any) -> bool:
    store = get_store()
    states = store.run(store.plans.read([user.pk]))
    assert states is not None
    return user.pk in states


def befriend(a: Any, b: Any) -> None:
    Contact.objects.create(owner=a, contact=b)
    Contact.objects.create(owner=b, contact=a)


def test_persists_stale_users_and_removes_them_keeping_online_ones(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    window = get_settings().ONLINE_WINDOW
    stale = [make_user() for _ in range(3)]
    online = make_user()
    for i, user in enumerate(stale):
        clock.move_to(at(i))
        api.touch(user)
    clock.move_to(at(window))
    api.touch(online)

    clock.move_to(at(2 + window + 1))  # the third stale user went quiet just past the window
    output = cleanup()

    assert counts(output) == {
        "buckets": get_settings().BUCKETS,
        "stale": 3,
        "persisted": 3,
        "removed": 3,
        "expired": 0,
    }
    for i, user in enumerate(stale):
        assert LastSeen.objects.get(user=user).seen_at == at(i)
        assert not in_redis(user)
    assert in_redis(online)
    assert not LastSeen.objects.filter(user=online).exists()
    assert api.get_presence(online, online).status is Status.ONLINE


def test_a_user_within_the_online_window_is_not_stale(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user = make_user()
    api.touch(user)
    clock.shift(get_settings().ONLINE_WINDOW - 1)
    assert counts(cleanup())["stale"] == 0
    assert in_redis(user)


def test_never_moves_last_seen_backwards(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user, other = make_user(), make_user()
    api.touch(user)
    api.touch(other)
    # Newer than Redis knows, e.g. written by a logout in another region.
    LastSeen.objects.create(user=user, seen_at=at(100))
    LastSeen.objects.create(user=other, seen_at=at(-100))  # older: moves forward
    clock.shift(get_settings().ONLINE_WINDOW + 200)

    cleanup()

    assert LastSeen.objects.get(user=user).seen_at == at(100)
    assert LastSeen.objects.get(user=other).seen_at == T0
    assert not in_redis(user) and not in_redis(other)


def test_dry_run_changes_nothing_and_reports_counts(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    users = [make_user() for _ in range(4)]
    for user in users:
        api.touch(user)
    expiring = users[0]
    api.set_status(expiring, "auto", text="lunch", expires_at=at(60))
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    api.touch(users[3])  # active again: not stale

    output = cleanup("--dry-run")

    assert output.startswith("Dry run")
    assert counts(output) == {"buckets": get_settings().BUCKETS, "stale": 3, "expired": 1}
    assert all(in_redis(user) for user in users)
    assert LastSeen.objects.count() == 0
    assert UserStatus.objects.get(user=expiring).text == "lunch"
    # The real run then does what the dry run announced.
    assert counts(cleanup())["stale"] == 3


def test_second_run_finds_nothing(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    for _ in range(3):
        api.touch(make_user())
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    assert counts(cleanup())["removed"] == 3
    rows = list(LastSeen.objects.values_list("user_id", "seen_at").order_by("user_id"))

    second = counts(cleanup())

    assert (second["stale"], second["persisted"], second["removed"]) == (0, 0, 0)
    assert list(LastSeen.objects.values_list("user_id", "seen_at").order_by("user_id")) == rows


def test_last_seen_survives_a_redis_flush(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    target, friend = make_user(), make_user()
    befriend(target, friend)
    api.touch(target)
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    cleanup()

    redis_client.flushall()

    seen = api.get_presence(target, friend)
    assert seen.status is Status.OFFLINE
    assert seen.last_seen == T0


def test_an_entry_touched_between_scan_and_removal_is_kept(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    store = get_store()
    user, other = make_user(), make_user()
    api.touch(user)
    api.touch(other)
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    buckets = sorted({store.keys.bucket_of(user.pk), store.keys.bucket_of(other.pk)})
    entries = store.run(store.plans.scan_stale(buckets, before=time.time() - 300))
    assert {e.user_id for e in entries} == {user.pk, other.pk}

    api.touch(user)  # back, after the scan
    removed = store.run(store.plans.remove_unchanged(entries, time.time()))

    assert removed == 1
    assert in_redis(user) and not in_redis(other)
    assert api.get_presence(user, user).status is Status.ONLINE


def test_an_entry_signed_off_between_scan_and_removal_is_kept(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # A logout changes the score as well: its fresher last seen must not be dropped unread.
    store = get_store()
    user = make_user()
    api.touch(user)
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    entries = store.run(
        store.plans.scan_stale([store.keys.bucket_of(user.pk)], before=time.time() - 300)
    )
    api.sign_off(user)
    assert store.run(store.plans.remove_unchanged(entries, time.time())) == 0
    assert in_redis(user)


def test_many_users_in_few_buckets_in_small_batches(
    make_user: Callable[..., Any], settings: Any, clock: time_machine.Coordinates
) -> None:
    settings.PRESENCE = {"BUCKETS": 4, "CLEANUP_BATCH": 1}
    users = [make_user() for _ in range(10)]
    for user in users[:7]:
        api.touch(user)
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    for user in users[7:]:
        api.touch(user)

    report = counts(cleanup("--batch", "3"))

    assert report["buckets"] == 4
    assert (report["stale"], report["persisted"], report["removed"]) == (7, 7, 7)
    assert set(LastSeen.objects.values_list("user_id", flat=True)) == {u.pk for u in users[:7]}
    assert all(in_redis(u) for u in users[7:])


@pytest.mark.parametrize("batch", ["0", "-3"])
def test_batch_must_be_positive(batch: str) -> None:
    with pytest.raises(CommandError, match="--batch"):
        cleanup("--batch", batch)


@pytest.mark.parametrize("batch", [0, -1])
def test_the_api_refuses_a_batch_below_one(batch: int) -> None:
    # A batch below 1 scanned nothing and reported success; 0 was taken for the default.
    with pytest.raises(ValueError, match="positive int, or None"):
        api.cleanup(dry_run=True, batch=batch)


def test_signed_off_users_are_persisted_and_removed(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    target, friend = make_user(), make_user()
    befriend(target, friend)
    api.touch(target)
    clock.shift(30)
    api.sign_off(target)
    clock.shift(get_settings().OFFLINE_GRACE + 1)

    assert counts(cleanup())["removed"] == 1

    assert not in_redis(target)
    assert LastSeen.objects.get(user=target).seen_at == at(30)
    seen = api.get_presence(target, friend)
    assert (seen.status, seen.last_seen) == (Status.OFFLINE, at(30))


def test_a_user_signed_off_within_the_grace_stays_online_to_friends(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    target, friend = make_user(), make_user()
    befriend(target, friend)
    api.touch(target)
    api.sign_off(target)
    clock.shift(get_settings().OFFLINE_GRACE - 1)

    assert counts(cleanup())["removed"] == 0

    assert api.get_presence(target, friend).status is Status.ONLINE
    clock.shift(2)
    assert counts(cleanup())["removed"] == 1
    assert api.get_presence(target, friend).status is Status.OFFLINE


def test_expired_custom_statuses_are_cleared(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    expired, lasting, forever = make_user(), make_user(), make_user()
    api.set_status(expired, "dnd", text="in a meeting", emoji="📅", expires_at=at(60))
    api.set_status(lasting, "auto", text="travelling", expires_at=at(3600))
    api.set_status(forever, "auto", activity="writing a book")
    clock.shift(61)

    assert counts(cleanup())["expired"] == 1

    cleared = UserStatus.objects.get(user=expired)
    assert (cleared.text, cleared.emoji, cleared.activity, cleared.expires_at) == ("", "", "", None)
    assert cleared.dnd  # the chosen status stays; only the custom text expires
    assert UserStatus.objects.get(user=lasting).text == "travelling"
    assert UserStatus.objects.get(user=forever).activity == "writing a book"
    assert counts(cleanup())["expired"] == 0


def test_stale_entries_of_deleted_users_are_removed(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    gone, kept = make_user(), make_user()
    api.touch(gone)
    api.touch(kept)
    gone_pk = gone.pk
    gone.delete()
    clock.shift(get_settings().ONLINE_WINDOW + 1)

    report = counts(cleanup())

    assert (report["stale"], report["persisted"], report["removed"]) == (2, 1, 2)
    store = get_store()
    states = store.run(store.plans.read([gone_pk]))
    assert states == {}
    assert list(LastSeen.objects.values_list("user_id", flat=True)) == [kept.pk]


def test_output_reports_the_counts(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    for _ in range(2):
        api.touch(make_user())
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    output = cleanup()
    assert output.strip() == (
        f"Scanned {get_settings().BUCKETS} buckets: 2 stale entries, 2 last seen times "
        "persisted, 2 removed from Redis; 0 expired custom statuses cleared; 0 room members "
        "whose stay ended removed from 0 rooms (0 rooms left empty, their keys removed)."
    )


# --- two at once -------------------------------------------------------------------------------


def test_two_interleaved_cleanups_persist_once_and_remove_once(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # The steps of two cleanups, interleaved by hand: both scan before either removes.
    store = get_store()
    users = [make_user() for _ in range(5)]
    for i, user in enumerate(users):
        clock.move_to(at(i))
        api.touch(user)
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    buckets = sorted({store.keys.bucket_of(u.pk) for u in users})
    before = time.time() - get_settings().ONLINE_WINDOW

    first = store.run(store.plans.scan_stale(buckets, before))
    second = store.run(store.plans.scan_stale(buckets, before))
    LastSeen.objects.record_many({e.user_id: e.seen_at for e in first})
    assert store.run(store.plans.remove_unchanged(first, time.time())) == 5
    LastSeen.objects.record_many({e.user_id: e.seen_at for e in second})
    assert store.run(store.plans.remove_unchanged(second, time.time())) == 0

    assert LastSeen.objects.count() == 5
    for i, user in enumerate(users):
        assert LastSeen.objects.get(user=user).seen_at == at(i)
        assert not in_redis(user)


def cleanup_in_thread(start: threading.Barrier, outputs: list[str], failures: list[Any]) -> None:
    try:
        start.wait()
        outputs.append(cleanup("--batch", "16384"))
    except BaseException as exc:  # reported by the test, in its own thread
        failures.append(exc)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_two_cleanups_at_once(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        # Two writers on SQLite's shared-cache in-memory test database fail at once with
        # "database table is locked" instead of waiting as on a SQLite file; the interleaved
        # test above covers SQLite.
        pytest.skip("needs a database where two connections can write at once")
    users = [make_user() for _ in range(60)]
    for round_ in range(3):
        for i, user in enumerate(users):
            clock.move_to(at(1000 * round_ + i))
            api.touch(user)
        clock.shift(get_settings().ONLINE_WINDOW + 1)
        # As after a Redis restart: both runs find the removal script missing, and one may
        # load it while the other's pipeline is half-way through.
        redis_client.script_flush()
        start = threading.Barrier(2)
        outputs: list[str] = []
        failures: list[Any] = []
        threads = [
            threading.Thread(target=cleanup_in_thread, args=(start, outputs, failures))
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        assert failures == []
        reports = [counts(output) for output in outputs]
        # Between them, every stale user was removed exactly once, and persisted.
        assert sum(r["removed"] for r in reports) == 60
        for i, user in enumerate(users):
            assert LastSeen.objects.get(user=user).seen_at == at(1000 * round_ + i)
            assert not in_redis(user)
    assert LastSeen.objects.count() == 60


def test_removal_counts_stay_exact_when_redis_loses_its_scripts_mid_pipeline(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    # The race of the test above, made deterministic: a SCRIPT LOAD (by "another client") lands
    # between the removals of two buckets of one pipeline, so Redis refuses the first and runs
    # the second. Only the refused one may be sent again; re-sending both counted 1 of 2.
    store = get_store()
    first, second = make_user(), make_user()
    assert store.keys.bucket_of(first.pk) != store.keys.bucket_of(second.pk)  # one removal each
    api.touch(first)
    api.touch(second)
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    buckets = sorted({store.keys.bucket_of(first.pk), store.keys.bucket_of(second.pk)})
    entries = store.run(store.plans.scan_stale(buckets, time.time() - get_settings().ONLINE_WINDOW))
    by_user = {e.user_id: e for e in entries}
    redis_client.script_flush()
    removal = store.plans.remove_unchanged([by_user[first.pk]], time.time())
    other_removal = store.plans.remove_unchanged([by_user[second.pk]], time.time())
    source = REMOVE_IF_UNCHANGED.source
    # (lowercase: a raw command, not one of the store's script calls)
    plan = Plan(
        commands=[*removal.commands, ("script", "load", source), *other_removal.commands],
        parse=lambda replies: removal.parse(replies[:1]) + other_removal.parse(replies[2:]),
        fallback=RAISE,
    )

    assert store.run(plan) == 2
    assert not in_redis(first) and not in_redis(second)


# --- Redis outages -----------------------------------------------------------------------------


def test_redis_down_fails_with_a_clear_error_and_persists_nothing(
    make_user: Callable[..., Any], private_redis: Any, clock: time_machine.Coordinates
) -> None:
    user = make_user()
    api.touch(user)
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    private_redis.stop()

    with pytest.raises(CommandError, match="Redis is unavailable") as error:
        cleanup()

    assert isinstance(error.value.__cause__, StoreUnavailable)
    assert LastSeen.objects.count() == 0


def test_redis_failing_before_removal_removes_nothing(
    make_user: Callable[..., Any],
    private_redis: Any,
    settings: Any,
    clock: time_machine.Coordinates,
) -> None:
    # Scans work but writes hang past the socket timeout: the script removing entries fails.
    # One batch of every bucket: the users' buckets (UUIDs spread them) are read together.
    settings.PRESENCE = {"SOCKET_TIMEOUT": 0.2, "BUCKETS": 1024, "CLEANUP_BATCH": 1024}
    users = [make_user() for _ in range(3)]
    for user in users:
        api.touch(user)
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    admin = redis.Redis.from_url(private_redis.url)
    try:
        admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
        try:
            with pytest.raises(
                CommandError, match="Redis is too slow: no reply within SOCKET_TIMEOUT"
            ):
                cleanup()
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
        store = get_store()
        key_of = {u.pk: store.keys.seen_key(store.keys.bucket_of(u.pk)) for u in users}
        still_there = [admin.zscore(key_of[u.pk], redis_member(u)) is not None for u in users]
    finally:
        admin.close()

    # Nothing was removed, and what was read was persisted first (never the other way round).
    assert still_there == [True, True, True]
    assert LastSeen.objects.count() == 3

    # Once Redis answers again, a new run finishes the job.
    clock.shift(get_settings().RETRY_INTERVAL)
    assert counts(cleanup())["removed"] == 3


def test_cleanup_report_from_the_api(
    make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # The command is thin over api.cleanup; the report object carries the same numbers.
    users = [make_user() for _ in range(2)]
    for user in users:
        api.touch(user, Device.MOBILE.value)
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    dry = api.cleanup(dry_run=True)
    assert (dry.stale, dry.persisted, dry.removed, dry.dry_run) == (2, 0, 0, True)
    report = api.cleanup()
    assert (report.stale, report.persisted, report.removed) == (2, 2, 2)


# --- live connections and the live layer's schedules -----------------------------------------


def beat(user: Any, connection_id: str = "c1", device: Device = Device.WEB) -> None:
    store = get_store()
    store.run(store.plans.connection(user.pk, "beat", time.time(), connection_id, device=device))


def connections_of(user: Any, redis_client: redis.Redis) -> str | None:
    store = get_store()
    entries = store.run(store.plans.describe_connections(user.pk))
    return ",".join(entries) if entries else None


@pytest.mark.django_db
def test_prunes_schedules_older_than_the_online_window(
    redis_client: redis.Redis, clock: time_machine.Coordinates
) -> None:
    store = get_store()
    now = int(T0.timestamp())
    window = get_settings().ONLINE_WINDOW
    due = {1: now - window - 100, 2: now - window, 3: now + 5}
    expiring = {4: now - window - 1, 5: now - 10}
    for user_id, when in due.items():
        redis_client.zadd(store.keys.user_due_key(user_id), {str(user_id): when})
    for user_id, when in expiring.items():
        redis_client.zadd(store.keys.user_expiring_key(user_id), {str(user_id): when})

    cleanup()

    # Long past: no live process swept them (a site without one never does).
    assert [u for u in due if redis_client.zscore(store.keys.user_due_key(u), u)] == [2, 3]
    assert [u for u in expiring if redis_client.zscore(store.keys.user_expiring_key(u), u)] == [5]


@pytest.mark.django_db
def test_dry_run_keeps_the_schedules(
    redis_client: redis.Redis, clock: time_machine.Coordinates
) -> None:
    store = get_store()
    redis_client.zadd(store.keys.user_due_key(1), {"1": int(T0.timestamp()) - 10_000})
    cleanup("--dry-run")
    assert redis_client.zrange(store.keys.user_due_key(1), 0, -1) == ["1"]


def test_crashed_connections_are_persisted_at_their_last_heartbeat_and_removed(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    crashed, live, closed = make_user(), make_user(), make_user()
    beat(crashed, "a", Device.MOBILE)
    beat(live, "b")
    beat(closed, "c")
    clock.shift(20)
    beat(crashed, "a", Device.MOBILE)  # its last heartbeat
    store = get_store()
    store.run(store.plans.connection(closed.pk, "close", time.time(), "c"))
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    beat(live, "b")  # still connected

    report = counts(cleanup())

    assert (report["stale"], report["persisted"], report["removed"]) == (2, 2, 2)
    assert LastSeen.objects.get(user=crashed).seen_at == at(20)
    assert LastSeen.objects.get(user=closed).seen_at == at(20)
    for user in (crashed, closed):
        assert not in_redis(user)
        assert connections_of(user, redis_client) is None
        # Nothing of their connections is left behind in the bucket.
        bucket = f"presence:{{{get_store().keys.bucket_of(user.pk)}}}"
        assert [
            f for f in redis_client.hkeys(f"{bucket}:conns") if f.split(":")[0] == str(user.pk)
        ] == []
        assert redis_client.zrangebylex(f"{bucket}:expiries", f"[{user.pk}:", f"({user.pk};") == []
    assert in_redis(live)
    assert connections_of(live, redis_client) == f"b:1:0:{int(T0.timestamp())}:{int(time.time())}"
    assert not LastSeen.objects.filter(user=live).exists()


def test_connected_users_within_their_ttl_are_kept(
    make_user: Callable[..., Any],
    settings: Any,
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
) -> None:
    # A CONNECTION_TTL longer than ONLINE_WINDOW: a connection last heard 350 s ago is still
    # live, although its score is older than the window.
    settings.PRESENCE = {"CONNECTION_TTL": 400, "ONLINE_WINDOW": 300}
    user, gone = make_user(), make_user()
    beat(user, "a")
    beat(gone, "b")
    clock.shift(50)
    beat(user, "a")
    clock.shift(351)  # 351 s after user's last heartbeat, 401 s after gone's (TTL + 1 s)

    report = counts(cleanup())

    assert (report["stale"], report["persisted"], report["removed"]) == (1, 1, 1)
    assert in_redis(user)
    assert connections_of(user, redis_client) == (
        f"a:1:0:{int(T0.timestamp())}:{int(T0.timestamp()) + 50}"
    )
    assert api.get_presence(user, user).status is Status.ONLINE
    assert not in_redis(gone)
    assert connections_of(gone, redis_client) is None
    assert LastSeen.objects.get(user=gone).seen_at == T0
