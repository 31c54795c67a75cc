"""GET presence/api/health: 200 while presence's Redis and the channel layer answer, 503 naming
the part that does not (real redis-servers, stopped by pid); no login, no database, no limit
that would trip a probe; the hub's lag when a hub runs on the serving loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.test import AsyncClient, Client, override_settings
from django.urls import reverse

from tests.live.sockets import Sockets, lets_see, new_user, receive, subscribe
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets
from tools.redis_server import RedisServer

pytestmark = [pytest.mark.uuid_site, pytest.mark.cluster, pytest.mark.pubsub_layer]

LAYERS = {
    "core": "channels_redis.core.RedisChannelLayer",
    "pubsub": "channels_redis.pubsub.RedisPubSubChannelLayer",
}


def health(client: Client) -> Any:
    return client.get(reverse("presence:health"))


@pytest.fixture
def stopped_server() -> Iterator[RedisServer]:
    """A redis-server that answered once and was then stopped (its port refuses)."""
    with RedisServer() as server:
        server.stop()
        yield server


def test_healthy_answers_200_without_login_or_database(
    client: Client, db: Any, django_assert_num_queries: Any
) -> None:
    with django_assert_num_queries(0):
        response = health(client)
    assert response.status_code == 200
    assert response.json() == {"redis": "ok", "layer": "ok", "lag": None}
    assert "no-cache" in response["Cache-Control"]


def test_head_answers_like_get(client: Client) -> None:
    assert client.head(reverse("presence:health")).status_code == 200


def test_other_methods_are_refused_in_json(client: Client) -> None:
    response = client.post(reverse("presence:health"))
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert response["Allow"] == "GET, HEAD"


def test_probes_in_a_row_are_never_limited(client: Client, settings: Any) -> None:
    # A load balancer probes every few seconds from each of its nodes, for ever.
    settings.PRESENCE = {**settings.PRESENCE, "RATE_LIMIT": (2, 10), "HTTP_RATE_LIMIT": (2, 60)}
    assert {health(client).status_code for _ in range(20)} == {200}


def test_a_stopped_presence_redis_answers_503_naming_redis(
    client: Client, db: Any, private_redis: RedisServer, django_assert_num_queries: Any
) -> None:
    assert health(client).status_code == 200
    private_redis.stop()
    with django_assert_num_queries(0):
        response = health(client)
    assert response.status_code == 503
    assert response.json() == {"redis": "unavailable", "layer": "ok", "lag": None}
    # Back as soon as it answers again: nothing to wait for.
    private_redis.start()
    assert health(client).json() == {"redis": "ok", "layer": "ok", "lag": None}


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_a_stopped_layer_server_answers_503_naming_the_layer(
    client: Client, kind: str, stopped_server: RedisServer, redis_url: str
) -> None:
    layers = {
        "default": {
            "BACKEND": LAYERS[kind],
            # One server answers, the other is down: the layer is not healthy.
            "CONFIG": {"hosts": [redis_url, stopped_server.url]},
        }
    }
    with override_settings(CHANNEL_LAYERS=layers):
        response = health(client)
    assert response.status_code == 503
    assert response.json()["layer"] == "unavailable"
    assert response.json()["redis"] == "ok"


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_every_layer_server_answering_is_ok(client: Client, kind: str, redis_url: str) -> None:
    with RedisServer() as second:
        layers = {
            "default": {"BACKEND": LAYERS[kind], "CONFIG": {"hosts": [redis_url, second.url]}}
        }
        with override_settings(CHANNEL_LAYERS=layers):
            response = health(client)
    assert response.status_code == 200, response.json()
    assert response.json()["layer"] == "ok"


def layer_of(kind: str, *urls: str) -> dict[str, Any]:
    return {"default": {"BACKEND": LAYERS[kind], "CONFIG": {"hosts": list(urls)}}}


def connections_received(counter: redis.Redis) -> int:
    """Connections the server accepted so far, ``counter``'s own (open already) among them."""
    return int(counter.info("stats")["total_connections_received"])


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_probes_in_a_row_keep_one_connection_to_the_layer(client: Client, kind: str) -> None:
    # An anonymous flood of health requests must not cost the layer's servers a connection
    # each. Each request of the test client runs on an event loop of its own (as under WSGI).
    with RedisServer() as server, redis.Redis.from_url(server.url) as counter:
        before = connections_received(counter)
        with override_settings(CHANNEL_LAYERS=layer_of(kind, server.url)):
            assert {health(client).status_code for _ in range(20)} == {200}
        assert connections_received(counter) - before <= 1


@pytest.mark.parametrize("kind", sorted(LAYERS))
async def test_probes_at_once_share_one_check_of_the_layer(kind: str) -> None:
    with RedisServer() as server, redis.Redis.from_url(server.url) as counter:
        before = connections_received(counter)
        with override_settings(CHANNEL_LAYERS=layer_of(kind, server.url)):
            client = AsyncClient()
            responses = await asyncio.gather(
                *(client.get(reverse("presence:health")) for _ in range(20))
            )
        assert {response.status_code for response in responses} == {200}
        assert {response.json()["layer"] for response in responses} == {"ok"}
        assert connections_received(counter) - before <= 1


def test_a_layer_server_that_stops_and_comes_back_is_seen_at_once(client: Client) -> None:
    server = RedisServer()
    with server, override_settings(CHANNEL_LAYERS=layer_of("core", server.url)):
        assert health(client).status_code == 200
        server.stop()
        response = health(client)
        assert response.status_code == 503
        assert response.json()["layer"] == "unavailable"
        server.start()
        # The kept connection was lost with the server: the next check makes a new one.
        assert health(client).json()["layer"] == "ok"


def test_without_a_channel_layer_the_layer_is_none_and_healthy(client: Client) -> None:
    with override_settings(CHANNEL_LAYERS={}):
        response = health(client)
    assert response.status_code == 200
    assert response.json()["layer"] == "none"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_async_db_connections")
async def test_the_lag_of_the_hub_on_the_serving_loop(
    sockets: Sockets, make_user: Callable[..., Any]
) -> None:
    viewer, target = await new_user(make_user), await new_user(make_user)
    await lets_see(target, viewer)
    watcher = await sockets.open(viewer)
    await subscribe(watcher, target)
    await sockets.open(target)  # announced through the channel layer, received by the hub
    await receive(watcher)

    response = await AsyncClient().get(reverse("presence:health"))
    assert response.status_code == 200
    lag = response.json()["lag"]
    assert isinstance(lag, float)
    assert 0 <= lag < 5


def test_a_cluster_master_down_answers_503_and_is_counted_for_its_node(
    client: Client, settings: Any
) -> None:
    from prometheus_client import REGISTRY

    from presence import metrics
    from presence.store import get_store
    from tools.redis_cluster import RedisCluster

    with RedisCluster(masters=3) as cluster:
        settings.PRESENCE = {**settings.PRESENCE, "REDIS_CLUSTER": cluster.urls}
        assert health(client).json()["redis"] == "ok"
        victim_port = cluster.master_ports()[1]
        node = f"127.0.0.1:{victim_port}"
        outages = REGISTRY.get_sample_value("presence_redis_outages_total", {"node": node}) or 0
        cluster.node_by_port(victim_port).stop(kill=True)
        response = health(client)
        assert response.status_code == 503
        assert response.json()["redis"] == "unavailable"
        # The store's own failure policy, per master: the outage of that node is counted.
        metrics.switch(True)
        store = get_store()
        store.run(store.plans.read(range(1, 3000)))  # users on every master
        after = REGISTRY.get_sample_value("presence_redis_outages_total", {"node": node})
        assert after == outages + 1
        assert REGISTRY.get_sample_value("presence_redis_up", {"node": node}) == 0
