"""Change stamps keep each change's kinds (presence.store.plans.changes, lua/stamp_changes.lua
and lua/changed_since.lua): a reader is given, per user changed since its time, what kind of
change it was, a change of relation only when it was with the reader."""

from __future__ import annotations

import pytest
import redis

from presence import domain
from presence.domain import Change, Kind
from presence.store import PresenceStore
from tests.ids import uid
from tests.store.stores import NOW
from tests.store.stores import store as store

pytestmark = [pytest.mark.uuid_site, pytest.mark.cluster]

VIEWER, OTHER = uid(90), uid(91)


@pytest.fixture(autouse=True)
def stamps_kept(store: PresenceStore) -> None:
    """Every shard keeps stamps (its epoch is written by its first stamp): a shard without
    them proves nothing (on a Redis Cluster each user's shard is its own)."""
    stamp(store, domain.LIVE_CHANGE, *(uid(n) for n in range(1000, 1400)), at=NOW - 1000)


def stamp(store: PresenceStore, change: Change, *users: object, at: float = NOW) -> None:
    assert store.run(store.plans.stamp_changes(list(users), at, 3600, change))


def changed(store: PresenceStore, viewer: object, *users: object, since: float = NOW - 1):
    found = store.run(store.plans.changed_since(list(users), viewer, since, NOW + 1))
    assert found is not None  # the epoch is kept
    return found[1]


def test_each_user_is_read_with_the_kinds_of_its_changes(store: PresenceStore) -> None:
    stamp(store, domain.LIVE_CHANGE, uid(1))
    stamp(store, domain.ACTIVITY_CHANGE, uid(2))
    stamp(store, domain.LIVE_CHANGE, uid(3))
    stamp(store, domain.RULES_CHANGE, uid(3))
    stamp(store, Change(Kind.ONLINE_FOR_CONTACTS | Kind.ACTIVITY_FOR_CLOSE_FRIENDS), uid(4))

    assert changed(store, VIEWER, uid(1), uid(2), uid(3), uid(4), uid(5)) == {
        uid(1): Kind.LIVE,
        uid(2): Kind.ACTIVITY,
        uid(3): Kind.LIVE | Kind.RULES | Kind.INVISIBLE,
        uid(4): Kind.ONLINE_FOR_CONTACTS | Kind.ACTIVITY_FOR_CLOSE_FRIENDS,
    }


def test_a_change_of_relation_is_read_as_such_by_its_viewer_alone(store: PresenceStore) -> None:
    stamp(store, domain.relation_change([VIEWER]), uid(1))

    assert changed(store, VIEWER, uid(1)) == {uid(1): Kind.RELATION}
    # Changed, but in no way another viewer can be told.
    assert changed(store, OTHER, uid(1)) == {uid(1): Kind(0)}


def test_only_kinds_stamped_since_the_reader_s_time_are_read(store: PresenceStore) -> None:
    stamp(store, domain.ACTIVITY_CHANGE, uid(1), at=NOW - 100)
    stamp(store, domain.LIVE_CHANGE, uid(1))

    assert changed(store, VIEWER, uid(1)) == {uid(1): Kind.LIVE}
    assert changed(store, VIEWER, uid(1), since=NOW - 200) == {uid(1): Kind.LIVE | Kind.ACTIVITY}


def test_a_stamp_of_no_kind_is_a_change_everyone_is_told(
    store: PresenceStore, redis_client: redis.Redis
) -> None:
    stamp(store, domain.LIVE_CHANGE, uid(2))  # the shard's epoch
    key = store.keys.changes_key(store.plans._by_shard([uid(1)]).popitem()[0])
    # As an earlier version stamped every change: the user's id alone.
    member = str(store.plans._by_shard([uid(1)]).popitem()[1][0])
    redis_client.zadd(key, {member: NOW})

    assert changed(store, VIEWER, uid(1)) == {uid(1): Kind.UNKNOWN}


def test_ids_that_spell_alike_do_not_share_a_relation_stamp(store: PresenceStore) -> None:
    # 'p:<length>:<target><viewer>': target 1 with viewer 23 is not target 12 with viewer 3.
    stamp(store, domain.relation_change([uid(23)]), uid(1))

    assert changed(store, uid(3), uid(12), uid(1)) == {uid(1): Kind(0)}
    assert changed(store, uid(23), uid(1)) == {uid(1): Kind.RELATION}
