"""The room layout at size: every key stays a listpack (segments in join order, an index that
splits as the room grows, per-second counts of stays ending), members are found past the
splits, a swept room's sparse segments merge back, the count is right before any sweep, and
``presence_cleanup`` leaves no room key behind (real Redis; time passed explicitly)."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
from django.core.management import call_command

from presence.store import get_store, merge, scripts
from presence.store.plans.rooms import STAY_SHIFT, b36
from presence.users import encode_id
from tests.ids import uid as u
from tests.rooms.members import (
    claimed,
    lasting_room_keys,
    no_room_key_left_once_leaves_are_past,
)

pytestmark = [pytest.mark.cluster, pytest.mark.uuid_site]

ROOM = "post:big"
T = 2_000_000_000.0
TTL = 90
SETTINGS = {"CONNECTION_TTL": TTL, "HEARTBEAT_INTERVAL": 30, "OFFLINE_GRACE": 5}
COMPACT = {"listpack", "ziplist", "intset"}


@pytest.fixture(autouse=True)
def _settings(settings: Any) -> None:
    settings.PRESENCE = dict(SETTINGS)


def run(plan: Any) -> Any:
    return get_store().run(plan)


def fill(room: str, users: range, at: float = T, **kw: Any) -> None:
    """Each user joins with one connection, a millisecond after the one before, in batches."""
    store = get_store()
    ids = list(users)
    for start in range(0, len(ids), 250):
        claimed(
            run(
                merge(
                    [
                        store.plans.join_room(room, u(n), f"conn-{n}", at + n / 1000, **kw)
                        for n in ids[start : start + 250]
                    ]
                )
            )
        )


def room_keys(redis_client: Any, room: str) -> list[str]:
    base = get_store().keys.room_key(room, "")
    return [k for k in redis_client.scan_iter(f"*{{room:{room}}}*", count=1000) if base in k]


def sweep(at: float) -> list[Any]:
    store = get_store()
    gone: list[Any] = []
    for _ in range(100):  # bounded: each round removes up to 1,000 members a room
        rooms = run(store.plans.claim_rooms(at, 100))
        if not rooms:
            return gone
        for room in rooms:
            removed, due, *_ = claimed(run(store.plans.prune_room(room, at, 1000)))
            gone += removed
            if due != float("inf"):
                run(store.plans.schedule_rooms({room: due}))
    raise AssertionError("the sweep did not end")


def test_every_key_of_a_big_room_stays_compact(redis_client: Any) -> None:
    """1,000 members, a third with a second connection, some with meta, some invisible: every
    key is a listpack (the old layout's sorted sets were skip lists past 128 members), and a
    member costs well under 100 B."""
    fill(ROOM, range(1, 1001))
    store = get_store()
    extra = [
        store.plans.join_room(
            ROOM, u(n), f"tab-{n}", T + 5, '{"mode":"editing"}' if n % 9 else None
        )
        for n in range(1, 1001, 3)
    ]
    extra += [store.plans.join_room(ROOM, u(n), f"conn-{n}", T + 6, invisible=True) for n in (7, 8)]
    run(merge(extra))
    keys = room_keys(redis_client, ROOM)
    assert len(keys) > 10  # segments and index buckets, not one big key
    encodings = {k: redis_client.object("encoding", k) for k in keys}
    assert {k: e for k, e in encodings.items() if e not in COMPACT} == {}
    size = sum(int(redis_client.memory_usage(k, samples=0)) for k in keys)
    # A string id (a UUID pk) is held twice, in its segment and in the index.
    member = encode_id(u(1))
    assert size / 1000 < 100 + (2 * len(member) if isinstance(member, str) else 0), size / 1000
    assert run(store.plans.room_count(ROOM, T + 10)) == 1000


def test_ids_in_a_stride_spread_over_the_index_buckets(redis_client: Any) -> None:
    """Integer ids are hashed for the index without a SHA-1: ids in a power-of-two stride
    (every 1,024th) still spread over the buckets, so every bucket stays a listpack and each
    member is found."""
    members = range(1024, 1024 * 1001, 1024)
    store = get_store()
    for start in range(0, 1000, 250):
        joins = [
            store.plans.join_room(ROOM, u(n), f"conn-{n}", T + i / 1000)
            for i, n in enumerate(members[start : start + 250], start)
        ]
        claimed(run(merge(joins)))
    keys = room_keys(redis_client, ROOM)
    encodings = {k: redis_client.object("encoding", k) for k in keys}
    assert {k: e for k, e in encodings.items() if e not in COMPACT} == {}
    lookups = tuple(u(n) for n in members[::9])
    state = run(store.plans.read_room(ROOM, T + 10, 0, lookups))
    assert state.present == 1000
    assert state.found == set(lookups)


def test_members_are_found_past_the_index_splits() -> None:
    fill(ROOM, range(1, 1501))
    store = get_store()
    lookups = tuple(u(n) for n in range(3, 1501, 7))
    state = run(store.plans.read_room(ROOM, T + 10, 50, lookups))
    assert state.present == 1500
    assert list(state.members)[:50] == [u(n) for n in range(1, 51)]  # by join time
    assert state.found == set(lookups)
    # Leaves and joins again find the member in its segment: the place is kept.
    for n in (1, 700, 1500):
        assert run(store.plans.leave_room(ROOM, u(n), f"conn-{n}", T + 20)).changed is False
        assert not run(store.plans.join_room(ROOM, u(n), "again", T + 21)).joined
    assert list(run(store.plans.read_room(ROOM, T + 22, 1, ())).members) == [u(1)]
    assert run(store.plans.room_count(ROOM, T + 22)) == 1500


def test_the_count_is_right_before_any_sweep() -> None:
    """Stays ending over many seconds: the count drops as each one passes, with no sweep."""
    store = get_store()
    for n in range(1, 301):
        run(store.plans.join_room(ROOM, u(n), "c", T + n // 10))  # 10 members a second
    for at in (T + 5, T + 1 + TTL, T + 1 + TTL + 7, T + 1 + TTL + 29, T + 1 + TTL + 30):
        alive = sum(1 for n in range(1, 301) if T + n // 10 + 1 + TTL > at)
        assert run(store.plans.room_count(ROOM, at)) == alive
        assert run(store.plans.read_room(ROOM, at, 0, ())).present == alive


def test_the_count_is_one_script_call_with_the_shift_of_the_room_scripts() -> None:
    """The count is one command (one round trip, one script), and its Lua reads the per-second
    counts with the shift the room scripts write them with."""
    plan = get_store().plans.room_count(ROOM, T)
    assert [command[0] for command in plan.commands] == ["SCRIPT"]
    for script in (scripts.ROOM_COUNT, scripts.ROOM_READ, scripts.ROOM_JOIN):
        assert f"local SHIFT = {STAY_SHIFT}" in script.source, script


def test_the_times_a_join_and_a_leave_send_in_base_36_are_the_entry_s_own(
    redis_client: Any,
) -> None:
    """A join's and a leave's times go to their scripts in base 36, as Python writes it, and the
    scripts store them as they come (no base-36 writing of their own): Python's base 36 and the
    scripts' are the same text for every number an entry holds."""
    numbers = [0, 1, 35, 36, 1295, 1296, 46655, 46656, 2**31, int(T) + 1 + TTL]
    numbers += [int(T * 1000) + n for n in range(0, 5000, 997)]
    lua = scripts.HEADER + scripts.read("outbox") + scripts.read("room_common")
    written = redis_client.eval(
        lua + "local out = {} for i, n in ipairs(ARGV) do out[i] = b36(tonumber(n)) end return out",
        1,
        get_store().keys.room_key(ROOM, "n"),
        *numbers,
    )
    assert written == [b36(n) for n in numbers]
    store = get_store()
    run(store.plans.join_room(ROOM, u(1), "conn-1", T + 0.25))
    run(store.plans.leave_room(ROOM, u(1), "conn-1", T + 3))
    (segment,) = [k for k in room_keys(redis_client, ROOM) if k.endswith(":s:0")]
    entry = redis_client.hget(segment, str(encode_id(u(1))))
    grace_end = int(T) + 3 + 1 + SETTINGS["OFFLINE_GRACE"]
    assert entry.startswith(b36(int(T * 1000) + 250) + ":")  # joined (ms), visible and public
    assert entry.endswith(b36(grace_end))
    assert run(store.plans.room_count(ROOM, grace_end - 1)) == 1
    assert run(store.plans.room_count(ROOM, grace_end)) == 0


def test_a_swept_room_merges_its_segments_and_keeps_the_order(redis_client: Any) -> None:
    """Nine in ten members crash: the sweep removes them and merges the nearly empty
    segments, so the survivors sit in few keys, still listed by join time."""
    fill(ROOM, range(1, 1001))
    store = get_store()
    survivors = list(range(10, 1001, 10))
    run(
        merge(
            [store.plans.join_room(ROOM, u(n), f"conn-{n}", T + 60, renew=True) for n in survivors]
        )
    )
    gone = sweep(T + 2 + TTL)
    assert len(gone) == 900
    assert run(store.plans.room_count(ROOM, T + 2 + TTL)) == 100
    state = run(store.plans.read_room(ROOM, T + 2 + TTL, 100, ()))
    assert list(state.members) == [u(n) for n in survivors]
    segments = [k for k in room_keys(redis_client, ROOM) if ":s:" in k]
    assert len(segments) <= 3, segments  # 100 members: at least a quarter full each
    assert sweep(T + 60 + 2 + TTL) and lasting_room_keys(redis_client, f"*{{room:{ROOM}}}*") == []


@pytest.mark.django_db
def test_cleanup_removes_every_room_key_and_says_so(redis_client: Any) -> None:
    store = get_store()
    then = time.time() - 3600
    for room in ("post:1", "post:2", "group:3"):
        fill(room, range(1, 201), at=then)
    run(store.plans.join_room("post:1", u(1), "meta", then, '{"m":1}', True))
    run(
        merge(
            [store.plans.leave_room("post:2", u(n), f"conn-{n}", then + 1) for n in range(1, 201)]
        )
    )
    out = io.StringIO()
    call_command("presence_cleanup", stdout=out)
    assert (
        "600 room members whose stay ended removed from 3 rooms (3 rooms left empty, "
        "their keys removed)."
    ) in out.getvalue()
    assert no_room_key_left_once_leaves_are_past(redis_client)


@pytest.mark.django_db
def test_cleanup_sweeps_a_room_its_sweeper_never_put_back(redis_client: Any) -> None:
    """A process claimed the room (out of its schedule) and stopped before putting it back:
    presence_cleanup finds the room's keys and sweeps it all the same."""
    store = get_store()
    then = time.time() - 3600
    fill("doc:a}b*", range(1, 4), at=then)
    assert run(store.plans.claim_rooms(time.time(), 100)) == ["doc:a}b*"]  # and never put back
    out = io.StringIO()
    call_command("presence_cleanup", stdout=out)
    assert "3 room members whose stay ended removed from 1 rooms" in out.getvalue()
    assert no_room_key_left_once_leaves_are_past(redis_client)
