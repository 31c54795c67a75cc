"""HTTP_READ_LIMIT (presence.ratelimit): a per-user budget of ids read through
``GET presence/api/presence``, shared through Redis, answered with 429 ``rate_limited`` and
Retry-After, failing open when Redis is down."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from django.test import Client

from presence import store as store_module

pytestmark = pytest.mark.django_db

URL = "/presence/api/presence"


@pytest.fixture
def user(clock: time_machine.Coordinates, make_user: Callable[..., Any]) -> Any:
    return make_user()


@pytest.fixture
def client(user: Any) -> Client:
    # Logged in after the clock stopped, so the session is fresh at the test's time.
    client = Client()
    client.force_login(user)
    return client


def read(client: Client, count: int, first: int = 1) -> Any:
    """A read of ``count`` distinct ids (of no user: each costs a lookup all the same)."""
    return client.get(URL, {"users": ",".join(str(first + n) for n in range(count))})


def assert_limited(response: Any, retry_after: int) -> None:
    assert response.status_code == 429, response.content
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["error"]["code"] == "rate_limited" and body["error"]["message"]
    assert response["Retry-After"] == str(retry_after)


def test_the_budget_counts_ids_stops_past_it_and_resets_with_the_window(
    settings: Any, client: Client, clock: time_machine.Coordinates
) -> None:
    # 1,000 ids per minute; the clock fixture starts on a whole minute (tests.clock.T0).
    settings.PRESENCE = {"HTTP_READ_LIMIT": (1000, 60)}
    assert read(client, 500).status_code == 200
    clock.shift(10)
    assert read(client, 400).status_code == 200
    assert read(client, 100).status_code == 200  # exactly the budget
    clock.shift(5)
    assert_limited(read(client, 100), retry_after=45)
    clock.shift(44)
    assert_limited(read(client, 1), retry_after=1)
    clock.shift(1)  # a new window, a whole budget
    assert read(client, 500).status_code == 200
    assert read(client, 500).status_code == 200


def test_a_small_read_costs_a_floor_a_large_one_at_most_the_budget(
    settings: Any, client: Client, make_user: Callable[..., Any]
) -> None:
    from presence.ratelimit import READ_MIN_IDS

    # Each request pays its queries whatever it asks: it counts as at least READ_MIN_IDS ids.
    settings.PRESENCE = {"HTTP_READ_LIMIT": (4 * READ_MIN_IDS, 60)}
    for _ in range(4):
        assert read(client, 1).status_code == 200
    assert_limited(read(client, 1), retry_after=60)
    # A budget below MAX_IDS still lets one full request through in each window.
    settings.PRESENCE = {"HTTP_READ_LIMIT": (100, 60)}
    other = Client()
    other.force_login(make_user())
    assert read(other, 500).status_code == 200
    assert_limited(read(other, 1), retry_after=60)


def test_duplicates_count_once(settings: Any, client: Client) -> None:
    settings.PRESENCE = {"HTTP_READ_LIMIT": (100, 60)}
    # 500 times the same id: one id, which costs the floor (READ_MIN_IDS = 25)
    assert client.get(URL, {"users": ",".join(["7"] * 500)}).status_code == 200
    assert read(client, 75).status_code == 200  # 25 + 75
    assert_limited(read(client, 1), retry_after=60)


def test_the_budget_is_per_user_and_shared_across_processes(
    settings: Any, client: Client, make_user: Callable[..., Any]
) -> None:
    settings.PRESENCE = {"HTTP_READ_LIMIT": (500, 60)}
    assert read(client, 500).status_code == 200
    store_module.reset_clients()  # another process: its own clients, the same counter
    assert_limited(read(client, 1), retry_after=60)
    other = Client()
    other.force_login(make_user())
    assert read(other, 500).status_code == 200


def test_bad_input_is_400_and_costs_nothing(settings: Any, client: Client) -> None:
    settings.PRESENCE = {"HTTP_READ_LIMIT": (500, 60)}
    assert client.get(URL, {"users": "1,x"}).json()["error"]["code"] == "invalid_users"
    assert read(client, 501).json()["error"]["code"] == "too_many_users"
    assert read(client, 500).status_code == 200


def test_reads_and_writes_have_separate_budgets(settings: Any, client: Client) -> None:
    settings.PRESENCE = {"HTTP_READ_LIMIT": (500, 60), "HTTP_RATE_LIMIT": (1, 60)}
    assert read(client, 500).status_code == 200
    posted = client.post("/presence/api/status", {"status": "dnd"}, "application/json")
    assert posted.status_code == 200


def test_the_default_allows_ten_full_reads_a_minute(client: Client) -> None:
    for _ in range(10):
        assert read(client, 500).status_code == 200
    assert_limited(read(client, 1), retry_after=60)


def test_none_turns_the_budget_off(settings: Any, client: Client) -> None:
    settings.PRESENCE = {"HTTP_READ_LIMIT": None}
    for _ in range(12):
        assert read(client, 500).status_code == 200


def test_fails_open_when_redis_is_down(
    settings: Any, private_redis: Any, user: Any, clock: time_machine.Coordinates
) -> None:
    settings.PRESENCE = {"HTTP_READ_LIMIT": (500, 60)}
    client = Client()
    client.force_login(user)
    private_redis.stop()
    for _ in range(3):
        assert read(client, 500).status_code == 200


def test_anonymous_callers_are_refused_before_any_count(
    settings: Any, client: Client, user: Any
) -> None:
    settings.PRESENCE = {"HTTP_READ_LIMIT": (500, 60)}
    for _ in range(3):
        assert Client().get(URL, {"users": "1"}).status_code == 401
    assert read(client, 500).status_code == 200
