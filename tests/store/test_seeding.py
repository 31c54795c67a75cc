"""The ledger's copy of the users' choices once Redis lost it (restarted empty, flushed): a user
it cannot tell is taken for invisible until the shard is seeded from the database, and a seed
(read from the database before) never undoes a choice written since (lua/seed_ledger.lua).
"""

from __future__ import annotations

from typing import Any

import pytest

from presence.domain import Device
from presence.store import PresenceStore
from presence.store.plans.ledger import SEED_PART
from tests.conftest import _flush_presence_state
from tests.ids import uid
from tests.store.stores import NOW
from tests.store.stores import store as store

pytestmark = [pytest.mark.uuid_site, pytest.mark.cluster]


@pytest.fixture
def lost(store: PresenceStore, redis_url: str) -> PresenceStore:
    """The store, its Redis having lost everything (a restart without persistence)."""
    _flush_presence_state(redis_url)
    return store


def shard(store: PresenceStore, user_id: object) -> int:
    return store.keys.shard_of_user(user_id)


def count(store: PresenceStore) -> int | None:
    return store.run(store.plans.count_online(NOW))


def by_shard(store: PresenceStore, users: list[Any]) -> dict[int, list[Any]]:
    found: dict[int, list[Any]] = {}
    for user in users:
        found.setdefault(shard(store, user), []).append(user)
    return found


def test_a_user_it_cannot_tell_is_taken_for_invisible_until_the_seed(lost: PresenceStore) -> None:
    store = lost
    shown, hidden = uid(1), uid(2)
    made = [store.run(store.plans.touch(user, Device.WEB, NOW)) for user in (shown, hidden)]
    # Either may have chosen to be invisible: neither is counted, and the signals are told
    # the choice was guessed (presence.outbox reads it from the database).
    assert [(t.made, t.invisible, t.guessed) for t in made if t] == [(1, True, True)] * 2
    assert count(store) == 0
    assert store.run(store.plans.unseeded_shards()) == list(store.keys.shards())
    # The seed, with what the database holds: the visible one is counted, at once.
    seeded = store.run(store.plans.seed(store.keys.shards(), {shard(store, hidden): [hidden]}, {}))
    assert seeded == len(store.keys.shards())
    assert store.run(store.plans.unseeded_shards()) == []
    assert count(store) == 1
    assert store.run(store.plans.invisible_members()) == {hidden}
    # Written as it is from then on, told as it is.
    again = store.run(store.plans.touch(uid(3), Device.WEB, NOW))
    assert again is not None and (again.invisible, again.guessed) == (False, False)
    assert count(store) == 2


def test_a_seed_leaves_the_choices_written_since_redis_lost_them(lost: PresenceStore) -> None:
    store = lost
    was_invisible, now_invisible = uid(4), uid(5)
    for user in (was_invisible, now_invisible):
        store.run(store.plans.touch(user, Device.WEB, NOW))
    # The database was read (both as they were), then both changed their minds, each change
    # written to Redis before the seed's own write.
    read_before = {shard(store, was_invisible): [was_invisible]}
    store.run(store.plans.set_invisible(was_invisible, False))
    store.run(store.plans.set_invisible(now_invisible, True))
    store.run(store.plans.seed(store.keys.shards(), read_before, {}))
    assert store.run(store.plans.invisible_members()) == {now_invisible}
    assert count(store) == 1  # was_invisible, visible now
    # A seed of another process, later with the same old reading, changes nothing.
    assert store.run(store.plans.seed(store.keys.shards(), read_before, {})) == 0
    assert store.run(store.plans.invisible_members()) == {now_invisible}


def test_a_seed_schedules_the_custom_statuses_ends_it_does_not_hold(
    lost: PresenceStore,
) -> None:
    store = lost
    kept, lost_end = uid(6), uid(7)
    # One status's end written since Redis lost them (its own write stands), one not.
    store.run(store.plans.schedule_expiry(kept, NOW + 600))
    ends = {
        shard(store, kept): [(kept, NOW + 60)],
        shard(store, lost_end): [(lost_end, NOW + 60)],
    }
    store.run(store.plans.seed(store.keys.shards(), {}, ends))
    _, expiring = store.run(store.plans.claim_due(NOW + 61, 100))
    assert expiring == [lost_end]
    _, expiring = store.run(store.plans.claim_due(NOW + 601, 100))
    assert expiring == [kept]


def test_a_seed_larger_than_one_script_call(lost: PresenceStore) -> None:
    store = lost
    users = [uid(100 + i) for i in range(SEED_PART * 2 + 5)]
    by_shard: dict[int, list[object]] = {}
    for user in users:
        by_shard.setdefault(shard(store, user), []).append(user)
    ends = {s: [(user, NOW + 60) for user in members] for s, members in by_shard.items()}
    store.run(store.plans.seed(store.keys.shards(), by_shard, ends))
    assert store.run(store.plans.invisible_members()) == set(users)
    assert len(store.run(store.plans.claim_due(NOW + 61, len(users) * 2))[1]) == len(users)


def test_a_shard_seeded_by_another_run_of_the_server_is_seeded_again(
    lost: PresenceStore, redis_client: Any
) -> None:
    # Seeded, then Redis restarted from a snapshot (or a replica took over): its copy is the
    # snapshot's, which the choices made since are missing from, and its markers those of the
    # run that seeded it, not this one's.
    store = lost
    went_visible, went_invisible, chose_again, online = uid(8), uid(9), uid(10), uid(11)
    store.run(store.plans.seed(store.keys.shards(), by_shard(store, [went_visible]), {}))
    for each in store.keys.shards():
        redis_client.set(store.keys.seeded_key(each), "another run")
    assert store.run(store.plans.unseeded_shards()) == list(store.keys.shards())
    # Until seeded again, a user it cannot tell is taken for invisible, and says so.
    made = store.run(store.plans.touch(online, Device.WEB, NOW))
    assert made is not None and (made.invisible, made.guessed) == (True, True)
    assert count(store) == 0
    store.run(store.plans.set_invisible(chose_again, True))  # written since: stands
    # The seed, with the database's choices: who went visible since the snapshot is taken out.
    database = by_shard(store, [went_invisible])
    assert store.run(store.plans.seed(store.keys.shards(), database, {})) == len(
        store.keys.shards()
    )
    assert store.run(store.plans.invisible_members()) == {went_invisible, chose_again}
    assert store.run(store.plans.unseeded_shards()) == []
    assert count(store) == 1  # online, visible


def test_the_outbox_entry_of_a_guessed_transition_says_it_was_guessed(
    lost: PresenceStore,
) -> None:
    # (the sweep that claims it, its caller having never read the reply, reads the choice
    # from the database: presence.outbox)
    store = lost
    store.run(store.plans.touch(uid(12), Device.WEB, NOW))
    [entry] = store.run(store.plans.claim_stale_entries(NOW + 100, 10))
    assert (entry.user_id, entry.made, entry.guessed) == (uid(12), 1, True)
