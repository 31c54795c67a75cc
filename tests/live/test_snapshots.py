"""The WebSocket consumer at ws/presence/: the snapshot a subscribe answers with.

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from asgiref.sync import sync_to_async

from presence import api, relations, signals
from presence.models import LastSeen, UserStatus
from presence.store import get_store
from tests.clock import at
from tests.ids import missing_id, wire_id
from tests.live.sockets import (
    HIDDEN,
    UNKNOWN_ID,
    Sockets,
    assert_silent,
    diff,
    error,
    iso,
    lets_see,
    new_user,
    online,
    presence,
    receive,
    state,
    subscribe,
    subscriptions,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets
from tests.privacy_cases import CUSTOM

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]


# --- snapshots --------------------------------------------------------------------------------


async def test_snapshot_is_sent_for_newly_subscribed_ids_only(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer = await new_user(make_user)
    on, off, custom, hidden = [await new_user(make_user) for _ in range(4)]
    await lets_see(on, viewer)
    await lets_see(off, viewer)
    await lets_see(custom, viewer)
    await sync_to_async(LastSeen.objects.record_many)({off.pk: at(-3600).timestamp()})
    await sync_to_async(UserStatus.objects.create)(user=custom, **CUSTOM)
    clock.shift(-10)
    await api.atouch(on, "mobile")  # online through a page request 10 s ago
    await api.atouch(hidden)  # online, but it does not let the viewer see it
    clock.shift(10)
    communicator = await sockets.open(viewer)

    assert await subscribe(communicator, on, off, custom, hidden, viewer) == state(
        {
            on.pk: online(-10, ("mobile",)),
            off.pk: presence("offline", iso(-3600)),
            custom.pk: presence(**CUSTOM),
            hidden.pk: HIDDEN,  # all but the day, and nothing before today is known
            viewer.pk: online(invisible=False),  # oneself: the true presence
        }
    )
    # Subscribing again to what is subscribed sends an empty snapshot; new ids only otherwise.
    assert await subscribe(communicator, on) == state({})
    assert await subscribe(communicator, off, on, off) == state({})
    newcomer = await new_user(make_user)
    assert await subscribe(communicator, on, newcomer, custom) == state({newcomer.pk: HIDDEN})


async def test_unsubscribe_stops_diffs(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target, other = [await new_user(make_user) for _ in range(3)]
    await lets_see(target, viewer)
    await lets_see(other, viewer)
    communicator = await sockets.open(viewer)
    assert await subscribe(communicator, target, other) == state(
        {target.pk: HIDDEN, other.pk: HIDDEN}
    )
    # An unsubscribe is not answered; ids not subscribed (here of no user) are ignored.
    await communicator.send_json_to({"type": "unsubscribe", "users": [wire_id(target), UNKNOWN_ID]})
    assert await subscribe(communicator) == state({})  # answered: the unsubscribe was handled
    await sockets.open(target)
    await sockets.open(other)  # still subscribed: the proof that diffs were being delivered
    assert await receive(communicator) == diff({other.pk: online()})
    await assert_silent(communicator)
    # Subscribing again sends the current presence as a snapshot.
    assert await subscribe(communicator, target) == state({target.pk: online()})


def spellings(user: Any) -> list[int | str]:
    """Ways a client may name ``user``: with integer pks a JSON number or a string, with UUID
    pks the canonical text or its upper case."""
    if isinstance(user.pk, int):
        return [user.pk, str(user.pk)]
    return [str(user.pk), str(user.pk).upper()]


async def test_ids_are_answered_as_the_client_spelt_them(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, first, second = [await new_user(make_user) for _ in range(3)]
    await lets_see(first, viewer)
    await lets_see(second, viewer)
    watcher = await sockets.open(viewer)
    # One of each spelling in one frame (integers: a number and a string); naming a user twice
    # subscribes once, under the first spelling.
    one, two = spellings(first)[0], spellings(second)[1]
    nobody = str(missing_id())
    users = [one, two, spellings(first)[1], nobody]
    await watcher.send_json_to({"type": "subscribe", "users": users})
    assert await receive(watcher) == state({one: HIDDEN, two: HIDDEN})
    assert await receive(watcher) == error(
        "unknown_users",
        f"No user has the id(s) {nobody}; the others are subscribed.",
        users=[nobody],  # as sent: a string stays a string
        answers="subscribe",
    )
    # Diffs keep the spelling of the subscription.
    await sockets.open(first)
    assert await receive(watcher) == diff({one: online()})
    await sockets.open(second)
    assert await receive(watcher) == diff({two: online()})
    # Unsubscribing in another spelling is the same user; subscribing again takes the new one.
    await watcher.send_json_to({"type": "unsubscribe", "users": [spellings(second)[0]]})
    assert await subscribe(watcher, spellings(second)[0]) == state({spellings(second)[0]: online()})
    assert subscriptions() == {first.pk: 1, second.pk: 1}


async def test_ids_the_sites_pk_cannot_be_are_refused_and_change_nothing(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    watcher = await sockets.open(viewer)
    # A UUID site takes no number; an integer site no UUID.
    bad = 7 if not isinstance(target.pk, int) else "0b6f2c9e-3d4a-4f1e-9c2b-7a1d5e8f9a10"
    await watcher.send_json_to({"type": "subscribe", "users": [wire_id(target), bad]})
    assert await receive(watcher) == error(
        "invalid_value", f"{bad!r} is not a user id.", answers="subscribe"
    )
    assert subscriptions() == {}
    assert await subscribe(watcher) == state({})


async def test_a_user_deleted_after_a_socket_found_them_is_unknown_to_the_next(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # The process remembers which ids are users' (no existence query for the next page's
    # socket); the snapshot catches one deleted since, which is then forgotten.
    viewer, kept, gone = [await new_user(make_user) for _ in range(3)]
    first = await sockets.open(viewer)
    assert await subscribe(first, kept, gone) == state({kept.pk: HIDDEN, gone.pk: HIDDEN})
    gone_pk = gone.pk
    assert gone_pk in relations.rows._known
    await sync_to_async(gone.delete)()
    second = await sockets.open(viewer)
    await second.send_json_to({"type": "subscribe", "users": [wire_id(kept), wire_id(gone_pk)]})
    assert await receive(second) == state({kept.pk: HIDDEN})
    assert (await receive(second))["code"] == "unknown_users"
    assert gone_pk not in relations.rows._known
    assert subscriptions() == {kept.pk: 2, gone_pk: 1}


async def test_a_snapshot_reads_redis_in_one_command_and_as_bulk_presence_does(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Users in as many buckets as they are: the read used to be two ZMSCOREs per bucket.
    viewer = await new_user(make_user)
    targets = [await new_user(make_user) for _ in range(12)]
    for n, target in enumerate(targets):
        if n % 3:
            await lets_see(target, viewer)
        if n % 2:
            await sockets.open(target)
    await sync_to_async(api.sign_off)(targets[3])
    watcher = await sockets.open(viewer)
    # The signals of those opens and the sign-off are claimed through the store too (on the
    # announcer's loop): claimed before the snapshot's plans are counted.
    await sync_to_async(signals.wait_sent)()
    store = get_store()
    sizes: list[int] = []
    real = store.arun

    async def counting(plan: Any, *, live: bool = False) -> Any:
        sizes.append(len(plan.commands))
        return await real(plan, live=live)

    monkeypatch.setattr(store, "arun", counting)
    snapshot = await subscribe(watcher, *targets)
    monkeypatch.undo()
    # One script call (on a cluster one per shard of theirs: a script's keys share a slot),
    # sent in one round trip, nothing else.
    shards = {store.keys.shard_of(store.keys.bucket_of(t.pk)) for t in targets}
    assert sizes == [len(shards) if store.keys.clustered else 1]
    expected = await sync_to_async(api.bulk_presence)([t.pk for t in targets], viewer)
    assert snapshot == state({pk: p.as_dict() for pk, p in expected.items()})
