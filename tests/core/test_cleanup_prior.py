"""presence_cleanup and the bucket's ``prior`` set (the last seen of an earlier UTC day,
lua/prior.lua): kept in Redis only as long as the user's entry (docs/privacy.md), so cleanup
persists it to ``LastSeen`` and removes it with the entry, and keeps it with an entry it keeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
import redis
import time_machine
from django.core.management import call_command

from presence import api
from presence.conf import get_settings
from presence.models import LastSeen
from presence.store import get_store
from tests.clock import at
from tests.ids import redis_member

pytestmark = [pytest.mark.uuid_site, pytest.mark.cluster]

DAY = 86400


def seen_on_two_days(user: Any, clock: time_machine.Coordinates) -> None:
    """A page view of ``user`` at T0, and the next UTC day (T0 is 09:30): the second keeps the
    first in the bucket's prior set."""
    api.touch(user)
    clock.move_to(at(DAY))
    api.touch(user)


def prior_in_redis(redis_client: redis.Redis, user: Any) -> float | None:
    store = get_store()
    prior = store.keys.prior_key(store.keys.bucket_of(user.pk))
    return redis_client.zscore(prior, redis_member(user.pk))


def test_cleanup_persists_the_prior_and_removes_it_with_the_entry(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    user = make_user()
    seen_on_two_days(user, clock)
    assert prior_in_redis(redis_client, user) == at(0).timestamp()

    clock.move_to(at(DAY + get_settings().ONLINE_WINDOW + 1))
    call_command("presence_cleanup", stdout=StringIO())

    row = LastSeen.objects.get(user=user)
    assert (row.seen_at, row.prior_seen_at) == (at(DAY), at(0))
    assert prior_in_redis(redis_client, user) is None
    # The entry gone, nothing of the user is left in the bucket's prior set either.
    store = get_store()
    assert store.run(store.plans.read([user.pk])) == {}


def test_an_entry_kept_keeps_its_prior(
    make_user: Callable[..., Any], clock: time_machine.Coordinates, redis_client: redis.Redis
) -> None:
    # Active again between the scan and the removal: the entry stays, and so does the last
    # seen of the earlier day its approximate last seen counts from until midnight.
    store = get_store()
    user = make_user()
    seen_on_two_days(user, clock)
    clock.shift(get_settings().ONLINE_WINDOW + 1)
    bucket = store.keys.bucket_of(user.pk)
    entries = store.run(store.plans.scan_stale([bucket], before=time.time() - 300))
    assert [entry.user_id for entry in entries] == [user.pk]

    api.touch(user)  # back, after the scan (the same day)
    assert store.run(store.plans.remove_stale(entries, time.time())).removed == 0

    assert prior_in_redis(redis_client, user) == at(0).timestamp()
