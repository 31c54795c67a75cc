"""The WebSocket consumer at ws/presence/: interest-based fan-out and what a subscribe costs.

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
import time_machine
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from presence.announce import group_name
from presence.hub import Hub
from presence.models import Contact
from tests.conftest import on_one_redis, on_the_core_layer
from tests.ids import missing_id, wire_id
from tests.live.sockets import (
    HIDDEN,
    TIMEOUT,
    UNKNOWN_ID,
    Sockets,
    assert_silent,
    diff,
    new_user,
    online,
    presence_settings,
    receive,
    state,
    subscribe,
    subscriptions,
)
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]


# --- interest-based fan-out -------------------------------------------------------------------


@sync_to_async
def followers_of(target: Any, count: int) -> list[Any]:
    """``count`` users following ``target``, each among its contacts (allowed to see it)."""
    from django.contrib.auth import get_user_model

    model = get_user_model()
    model.objects.bulk_create([model(username=f"fan{target.pk}-{i}") for i in range(count)])
    fans = list(model.objects.filter(username__startswith=f"fan{target.pk}-").order_by("pk"))
    Contact.objects.bulk_create(
        [Contact(owner=target, contact=fan) for fan in fans]
        + [Contact(owner=fan, contact=target) for fan in fans]
    )
    return fans


@on_one_redis
@on_the_core_layer
async def test_a_change_reaches_subscribed_connections_only_through_one_group_member(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
) -> None:
    target = await new_user(make_user)
    fans = await followers_of(target, 200)
    subscribers = [await sockets.open(fan) for fan in fans[:3]]
    for communicator in subscribers:
        assert await subscribe(communicator, target) == state({target.pk: HIDDEN})
    # Followers connected but not subscribed to the target (another page) get nothing.
    others = [await sockets.open(fan) for fan in fans[3:5]]

    # One process, one member in the target's group: the hub's channel, not one per viewer.
    hub = Hub.current()
    assert hub is not None and hub.groups.channel is not None
    layer = get_channel_layer()
    group = f"{layer.prefix}:group:{group_name(target.pk)}"
    assert redis_client.zrange(group, 0, -1) == [hub.groups.channel]

    await sockets.open(target)
    for communicator in subscribers:
        assert await receive(communicator) == diff({target.pk: online()})
    await assert_silent(*subscribers, *others)
    assert redis_client.zrange(group, 0, -1) == [hub.groups.channel]


# --- subscribe cost ---------------------------------------------------------------------------


@on_one_redis
@on_the_core_layer
async def test_a_subscribe_of_unknown_ids_joins_no_channel_layer_group(
    sockets: Sockets,
    make_user: Callable[..., Any],
    clock: time_machine.Coordinates,
    redis_client: redis.Redis,
    redis_commands: Any,
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    watcher = await sockets.open(viewer)
    unknown = [wire_id(missing_id(i)) for i in range(1000)]
    group_keys = f"{get_channel_layer().prefix}:group:*"
    before = redis_commands.snapshot()
    await watcher.send_json_to({"type": "subscribe", "users": unknown})
    assert await receive(watcher) == state({})
    assert (await receive(watcher))["users"] == unknown
    used = redis_commands.delta(before)
    # Nothing joined or left for them (group_add is a ZADD and an EXPIRE, group_discard a ZREM
    # per id), and hardly any Redis work at all.
    assert not {"zadd", "zrem", "expire"} & set(used), used
    assert sum(used.values()) <= 5, used
    assert list(redis_client.scan_iter(group_keys)) == []
    assert subscriptions() == {}
    # A known id among them still joins its group.
    await watcher.send_json_to({"type": "subscribe", "users": [UNKNOWN_ID, wire_id(target)]})
    assert await receive(watcher) == state({target.pk: HIDDEN})
    assert (await receive(watcher))["users"] == [UNKNOWN_ID]
    assert [key.rsplit(":", 1)[1] for key in redis_client.scan_iter(group_keys)] == [
        group_name(target.pk)
    ]


async def test_large_subscribes_count_as_several_frames_of_the_rate_limit(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    from presence.consumers import IDS_PER_FRAME

    many = [wire_id(missing_id(i)) for i in range(2 * IDS_PER_FRAME + 1)]  # three frames' worth
    with presence_settings(RATE_LIMIT=(5, 10)):
        user = await new_user(make_user)
        communicator = await sockets.open(user)  # 1
        await communicator.send_json_to({"type": "subscribe", "users": many})  # 2, 3, 4
        assert await receive(communicator) == state({})
        assert (await receive(communicator))["code"] == "unknown_users"
        await communicator.send_json_to({"type": "unsubscribe", "users": many})  # 5, 6, 7
        assert await communicator.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4429,
        }

        # A frame weighing more than the whole budget passes alone in its window.
        clock.shift(10)
        other = await sockets.open(await new_user(make_user))  # 1 of its own window
        clock.shift(10)
        heavy = [wire_id(missing_id(i)) for i in range(5 * IDS_PER_FRAME)]  # five frames' worth
        await other.send_json_to({"type": "subscribe", "users": heavy})
        assert await receive(other) == state({})
        assert (await receive(other))["code"] == "unknown_users"
        await other.send_json_to({"type": "heartbeat"})  # the budget is spent
        assert await other.receive_output(timeout=TIMEOUT) == {
            "type": "websocket.close",
            "code": 4429,
        }
