"""A page view's socket closes and the next page's opens moments later, watching mostly the
same users: the groups the closed one needed linger (presence.hub.groups.LINGER) instead of
being left and joined again. Helpers: tests/live/sockets.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from presence import api
from presence.hub import Hub, groups
from tests.conftest import on_one_redis, on_the_core_layer
from tests.live.sockets import (
    BASE,
    Sockets,
    _logged_in_client,
    _site_socket,
    eventually,
    lets_see,
    new_user,
    open_sockets,
    receive,
    subscribe,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.cluster,
    pytest.mark.pubsub_layer,
]


@pytest.fixture
async def sockets(transactional_db: Any, close_async_db_connections: Any) -> AsyncIterator[Sockets]:
    async for opened in open_sockets():
        yield opened


@pytest.fixture(autouse=True)
def _base_settings(settings: Any) -> None:
    settings.PRESENCE = dict(BASE)


@pytest.fixture
def layer_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(method, group) of every group_add and group_discard the layer is asked for."""
    calls: list[tuple[str, str]] = []
    layer = get_channel_layer()
    for method in ("group_add", "group_discard"):
        real = getattr(layer, method)

        async def counting(group: str, channel: str, real: Any = real, method: str = method) -> Any:
            calls.append((method, group))
            return await real(group, channel)

        monkeypatch.setattr(layer, method, counting)
    return calls


async def test_the_next_pages_socket_joins_no_group_again_and_hears_changes(
    sockets: Sockets, make_user: Callable[..., Any], layer_calls: list[tuple[str, str]]
) -> None:
    viewer, a, b = [await new_user(make_user) for _ in range(3)]
    for target in (a, b):
        await lets_see(target, viewer)
    client = await sync_to_async(_logged_in_client)(viewer)
    others = await sockets.open(await new_user(make_user))  # the process serves others too
    page = await _site_socket(sockets, client)
    assert (await subscribe(page, a, b))["type"] == "presence_state"
    await sockets.close(page)
    layer_calls.clear()

    next_page = await _site_socket(sockets, client)
    assert (await subscribe(next_page, a, b))["type"] == "presence_state"
    assert layer_calls == []  # neither a's and b's groups nor the account's
    await api.atouch(a)  # and the lingering group was the live one all along
    frame = await receive(next_page)
    assert frame["type"] == "presence_diff"
    assert frame["presences"][str(a.pk)]["status"] == "online"
    await sockets.close(next_page)
    await sockets.close(others)


async def test_groups_nobody_needs_are_left_after_linger_and_when_the_hub_stops(
    sockets: Sockets,
    make_user: Callable[..., Any],
    layer_calls: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(groups, "LINGER", 0.2)
    viewer, a, b = [await new_user(make_user) for _ in range(3)]
    others = await sockets.open(await new_user(make_user))
    page = await sockets.open(viewer)
    assert (await subscribe(page, a))["type"] == "presence_state"
    assert (await subscribe(others, b))["type"] == "presence_state"
    await sockets.close(page)
    hub = Hub.current()
    assert hub is not None

    async def a_left() -> bool:
        return ("group_discard", hub.registry.watchers.group(a.pk)) in layer_calls

    assert await eventually(a_left)
    assert hub.groups.lingering == {}
    # b is still watched: never left. Then the last socket's close stops the hub: its groups
    # are left at once, lingering or not.
    assert ("group_discard", hub.registry.watchers.group(b.pk)) not in layer_calls
    monkeypatch.setattr(groups, "LINGER", 3600.0)
    await sockets.close(others)
    assert ("group_discard", hub.registry.watchers.group(b.pk)) in layer_calls
    assert hub.groups.lingering == {}


@on_one_redis
@on_the_core_layer
async def test_no_lingering_group_outlives_the_hub(
    sockets: Sockets, make_user: Callable[..., Any], redis_client: Any
) -> None:
    viewer, a = [await new_user(make_user) for _ in range(2)]
    others = await sockets.open(await new_user(make_user))
    page = await sockets.open(viewer)
    assert (await subscribe(page, a))["type"] == "presence_state"
    await sockets.close(page)
    prefix = f"{get_channel_layer().prefix}:group:"
    assert any(redis_client.scan_iter(prefix + "*"))  # a's group lingers
    await sockets.close(others)
    assert list(redis_client.scan_iter(prefix + "*")) == []
