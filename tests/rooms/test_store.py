"""The room layout in Redis: joins, leaves, the grace, crash expiry, sweeps, and reads that
cost O(ROOM_LIST_LIMIT) whatever the room's size (real Redis; time passed explicitly)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from redis.crc import key_slot

from presence import outbox
from presence.store import get_store
from tests.ids import uid as u
from tests.rooms.members import claimed, lasting_room_keys

pytestmark = [pytest.mark.cluster, pytest.mark.uuid_site]

ROOM = "post:42"
T = 2_000_000_000.0
SETTINGS = {"CONNECTION_TTL": 90, "HEARTBEAT_INTERVAL": 30, "OFFLINE_GRACE": 5}


@pytest.fixture(autouse=True)
def _settings(settings: Any) -> None:
    settings.PRESENCE = dict(SETTINGS)


def run(plan: Any) -> Any:
    return get_store().run(plan)


def join(user: Any, conn: str = "c1", at: float = T, meta: str | None = None, **kw: Any) -> Any:
    return claimed(run(get_store().plans.join_room(ROOM, user, conn, at, meta, **kw)))


def leave(user: Any, conn: str = "c1", at: float = T) -> Any:
    return claimed(run(get_store().plans.leave_room(ROOM, user, conn, at)))


def read(at: float = T, first: int = 10, lookups: tuple[Any, ...] = ()) -> Any:
    return run(get_store().plans.read_room(ROOM, at, first, lookups))


def count(at: float = T) -> int:
    return run(get_store().plans.room_count(ROOM, at))


def sweep(at: float) -> list[Any]:
    store = get_store()
    gone: list[Any] = []
    for room in run(store.plans.claim_rooms(at, 100)):
        removed, due, *_ = claimed(run(store.plans.prune_room(room, at, 1000)))
        gone += removed
        if due != float("inf"):
            run(store.plans.schedule_rooms({room: due}))
    return gone


def test_a_rooms_keys_share_one_slot() -> None:
    store = get_store()
    for room in (ROOM, "doc:a}b", "group:{x}"):
        assert len({key_slot(key.encode()) for key in store.plans.room_keys(room)}) == 1


def test_join_counts_lists_and_replaces_meta() -> None:
    assert join(u(1), meta='{"mode":"reading"}').joined
    assert join(u(2), at=T + 1).joined
    assert count() == 2
    again = join(u(1), meta='{"mode":"editing"}', at=T + 2)
    assert not again.joined and again.changed
    state = read()
    assert state.present == 2
    assert list(state.members) == [u(1), u(2)]  # by join time: joining again keeps one's place
    assert state.members[u(1)].meta == '{"mode":"editing"}'
    assert state.members[u(2)].meta is None
    # The same meta again changes nothing others see.
    assert not join(u(1), meta='{"mode":"editing"}', at=T + 3).changed


def test_what_a_join_shows_is_the_meta_it_wrote_or_a_renewals_kept() -> None:
    join(u(1), meta='{"m":1}')
    # a renewal keeps the connection's meta: nothing others see changes
    assert not join(u(1), at=T + 1, renew=True).changed
    assert read(T + 1).members[u(1)].meta == '{"m":1}'
    # joining again without meta takes it away
    assert join(u(1), at=T + 2).changed
    assert read(T + 2).members[u(1)].meta is None
    assert not join(u(1), at=T + 3).changed


def test_two_connections_the_last_joined_meta_is_shown() -> None:
    join(u(1), "a", meta='{"m":"a"}')
    second = join(u(1), "b", at=T + 1, meta='{"m":"b"}')
    assert not second.joined and second.changed
    assert read().members[u(1)].meta == '{"m":"b"}'
    leave(u(1), "b", at=T + 2)
    assert read(T + 2).members[u(1)].meta == '{"m":"a"}'
    assert count(T + 2) == 1


def test_the_last_connection_leaving_keeps_the_user_for_the_grace() -> None:
    join(u(1))
    leave(u(1), at=T + 10)
    grace_end = T + 10 + 1 + 5
    assert count(grace_end - 1) == 1
    assert read(grace_end - 1).members[u(1)].meta is None
    assert count(grace_end) == 0
    assert sweep(grace_end - 1) == []
    assert sweep(grace_end) == [u(1)]
    assert read(grace_end).present == 0


def test_rejoining_within_the_grace_keeps_the_member() -> None:
    join(u(1), "a", meta='{"m":1}')
    leave(u(1), "a", at=T + 10)
    back = join(u(1), "b", at=T + 12, meta='{"m":1}')
    assert not back.joined
    assert sweep(T + 30) == []
    assert count(T + 30) == 1


def test_a_renewal_written_after_the_leave_keeps_the_connection_left() -> None:
    # A heartbeat's or a flag change's renewal under way when the leave was written: the user
    # still leaves when the grace ends, not a CONNECTION_TTL later.
    join(u(1), meta='{"m":1}')
    leave(u(1), at=T + 10)
    renewed = join(u(1), at=T + 11, invisible=True, renew=True)
    assert not renewed.joined
    grace_end = T + 10 + 1 + 5
    assert count(grace_end - 1) == 1
    assert read(grace_end - 1).invisible == {u(1)}  # its flag is written all the same
    assert sweep(grace_end) == [u(1)]
    assert read(grace_end).present == 0


def test_a_renewal_after_the_grace_of_a_left_connection_does_not_enter_again() -> None:
    join(u(1))
    join(u(2), "other")
    leave(u(1), at=T + 10)
    grace_end = T + 10 + 1 + 5
    late = join(u(1), at=grace_end + 1, renew=True)  # before the sweep
    assert not late.joined and late.changed  # its stay ended here: the room is told
    assert [(each.made, each.at) for each in late.made] == [(-1, grace_end)]
    assert read(grace_end + 1).present == 1
    # A join (not a renewal) enters again.
    assert join(u(1), at=grace_end + 2).joined


def test_leaving_a_room_never_joined_changes_nothing(redis_client: Any) -> None:
    assert not leave(u(1)).changed
    assert count() == 0
    join(u(2))
    assert not leave(u(1)).changed
    assert not leave(u(2), "other connection").changed
    assert count() == 1
    leave(u(2))
    assert not leave(u(2)).changed  # left already: the grace is not extended


def test_a_crashed_connection_leaves_after_the_ttl() -> None:
    join(u(1))
    stay = T + 1 + 90
    assert count(stay - 1) == 1
    assert count(stay) == 0
    assert sweep(stay) == [u(1)]


def test_renewing_keeps_place_and_meta_and_rejoins_after_a_crash() -> None:
    join(u(1), meta='{"m":1}')
    join(u(2), at=T + 1)
    renewed = join(u(1), at=T + 60, renew=True)
    assert not renewed.joined and not renewed.changed
    assert list(read(T + 60).members) == [u(1), u(2)]
    assert read(T + 60).members[u(1)].meta == '{"m":1}'
    assert sweep(T + 95) == [u(2)]
    # A heartbeat after the stay ended joins anew (the consumer renews with its meta).
    late = join(u(2), at=T + 200, renew=True)
    assert late.joined


def test_invisible_members_are_read_apart() -> None:
    join(u(1), invisible=True)
    join(u(2), at=T + 1)
    state = read(lookups=(u(3),))
    assert state.present == 2
    assert state.invisible == {u(1)}
    assert state.found == frozenset()
    join(u(1), invisible=False, at=T + 2)
    assert read().invisible == frozenset()


def test_lookups_find_members_past_the_first_page() -> None:
    for user in range(1, 21):
        join(u(user), at=T + user)
    state = read(T + 21, first=5, lookups=(u(17), u(99)))
    assert list(state.members) == [u(n) for n in (1, 2, 3, 4, 5, 17)]
    assert state.found == {u(17)}
    assert state.present == 20


def test_no_key_is_left_behind(redis_client: Any) -> None:
    join(u(1))
    join(u(2), "x", meta='{"a":1}', invisible=True)
    leave(u(1), at=T + 1)
    sweep(T + 500)
    assert lasting_room_keys(redis_client, f"*{{room:{ROOM}}}*") == []
    # The room stays due until its batch of leaves' outbox deadline (claimed meanwhile).
    sweep(T + 500 + outbox.deadline())
    assert redis_client.zcard(get_store().keys.room_schedule_key(ROOM)) == 0


def test_every_room_is_scheduled_to_be_swept(redis_client: Any) -> None:
    key = get_store().keys.room_schedule_key(ROOM)
    # A join is swept within the outbox's deadline (a room_entered its caller never claimed
    # is the sweep's then), a renewal by the stay's end (CONNECTION_TTL).
    join(u(1))
    assert redis_client.zscore(key, ROOM) == T + outbox.deadline()
    redis_client.delete(key)
    join(u(1), renew=True)
    assert redis_client.zscore(key, ROOM) == T + 1 + 90
    leave(u(1), at=T + 10)
    assert redis_client.zscore(key, ROOM) == T + 10 + 1 + 5


def _eval_usec(redis_client: Any) -> tuple[int, float]:
    masters = [redis_client]
    if hasattr(redis_client, "get_primaries"):
        import redis as redis_module

        masters = [
            redis_module.Redis(host=n.host, port=n.port) for n in redis_client.get_primaries()
        ]
    calls = usec = 0.0
    for master in masters:
        stats = master.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0})
        calls += int(stats["calls"])
        usec += int(stats["usec"])
    return int(calls), usec


def _fill(room: str, members: int) -> None:
    store = get_store()
    client = store.cluster or store.client
    # Written with the store's own script, in pipelines of 500.
    for start in range(0, members, 500):
        batch = [
            store.plans.join_room(room, u(user), "c", T + user / 1000)
            for user in range(start + 1, min(start + 501, members + 1))
        ]
        from presence.store import merge

        store.run(merge(batch))
    assert client is not None


def test_a_big_rooms_read_is_bounded(redis_client: Any) -> None:
    """A read of a 10,000-member room costs about what a 200-member room's does: the script's
    server time side by side (an O(members) read would be ~50 times as slow)."""
    store = get_store()
    _fill("big:1", 10_000)
    _fill("small:1", 200)
    limit = 100

    def server_time(room: str) -> float:
        best = float("inf")
        # Once first: on a cluster the master may have to load the script (a NOSCRIPT retry).
        store.run(store.plans.read_room(room, T + 20, 2 * limit, ()))
        for _ in range(5):
            calls, usec = _eval_usec(redis_client)
            state = store.run(
                store.plans.read_room(room, T + 20, 2 * limit, tuple(u(n) for n in range(1, 50)))
            )
            after_calls, after_usec = _eval_usec(redis_client)
            assert after_calls - calls == 1
            best = min(best, after_usec - usec)
        assert state.present in (10_000, 200)
        return best

    big, small = server_time("big:1"), server_time("small:1")
    assert big <= 3 * small + 50, (big, small)
    started = time.perf_counter()
    assert store.run(store.plans.room_count("big:1", T + 20)) == 10_000
    assert time.perf_counter() - started < 5  # sanity only; the figures are in the benchmarks


def test_the_sweep_reads_every_form_of_entry(redis_client: Any) -> None:
    """The sweep reads the common entry (one connection, a join time of 8 base-36 digits) by
    position and decodes any other: each form is removed whole, its meta and flags with it."""
    early = 50_000_000.0  # a join time of 7 base-36 digits (1971)
    join(u(1), at=early)  # one connection, its entry shorter
    join(u(2))  # the common entry
    join(u(3), meta='{"a":1}')  # one connection with meta
    join(u(4), invisible=True)  # invisible (and public, as every one here but the last)
    join(u(5), "c1", meta='{"b":2}')
    join(u(5), "c2")  # two connections, the first with meta
    # stays: the room's keys are not deleted with its last member
    join(u(6), at=T + 450, public=False)
    assert sorted(sweep(T + 500), key=str) == sorted([u(n) for n in range(1, 6)], key=str)
    assert count(T + 500) == 1
    # the removed members' metas, invisibility and public flag went with them
    base = get_store().keys.room_key(ROOM, "")
    for part in ("t", "v", "p"):
        assert not redis_client.exists(base + part), part


def test_a_join_run_late_enters_no_earlier_than_the_stay_the_sweep_pruned() -> None:
    """A busy process takes its join's time, a sweep elsewhere prunes the member's stay that
    ended meanwhile, then the join runs: its room_entered comes no earlier than that
    room_left, so the member's signals keep their order."""
    join(u(2))  # the room stays
    join(u(1))
    leave(u(1), at=T + 10)
    store = get_store()
    pruned = claimed(run(store.plans.prune_room(ROOM, T + 20, 1000)))
    [left] = [each for each in pruned.made if each.user_id == u(1)]
    assert left.made == -1 and left.at > T + 12
    late = join(u(1), at=T + 12)  # taken before the stay ended, run after the sweep
    assert late.joined and [(each.made, each.at) for each in late.made] == [(1, left.at)]
    # A join in time keeps its own moment.
    leave(u(1), at=T + 30)
    claimed(run(store.plans.prune_room(ROOM, T + 40, 1000)))
    again = join(u(1), at=T + 50)
    assert [(each.made, each.at) for each in again.made] == [(1, T + 50)]


def test_a_join_run_late_into_the_room_the_sweep_emptied_enters_no_earlier(
    redis_client: Any,
) -> None:
    """As above with the member the room's last: the sweep that prunes its stay empties the
    room (its keys go), and the join run late is still ordered after that room_left; then the
    room's own again, and gone from Redis a while after it emptied."""
    join(u(1))
    leave(u(1), at=T + 10)
    store = get_store()
    pruned = claimed(run(store.plans.prune_room(ROOM, T + 20, 1000)))
    [left] = pruned.made
    assert left.made == -1 and left.at > T + 12
    base = store.keys.room_key(ROOM, "")
    assert not redis_client.exists(base + "n")  # the room is empty
    late = join(u(1), at=T + 12)
    assert late.joined and [(each.made, each.at) for each in late.made] == [(1, left.at)]
    assert not redis_client.exists(base + "z")  # back in the room's summary
    # Emptied again: what is kept of it expires by itself.
    leave(u(1), at=T + 30)
    claimed(run(store.plans.prune_room(ROOM, T + 40, 1000)))
    assert 0 < redis_client.ttl(base + "z") <= 120
    assert lasting_room_keys(redis_client, f"*{{room:{ROOM}}}*") == []  # its :z alone
