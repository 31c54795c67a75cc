"""The load test's rooms (tools/loadtest/rooms.py): a client's view of a room from room_state
and room_diff, leaks of hidden and blocked users, who joins which room (free of I/O); room keys
left in a real Redis, found by the key scheme's own names."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from presence.store.keys import ROOM_Z_KEEP, KeyScheme
from tools.loadtest import rooms as loadtest_rooms
from tools.loadtest.rooms import BIG, KIND, RoomViews, assign, leftover_keys


def test_a_view_is_its_state_with_each_diff_applied() -> None:
    views = RoomViews()
    views.reset(["lobby:1"])
    assert views.pending == {"lobby:1"}
    # A diff before the room's state is dropped: the state follows and includes it.
    views.apply({"type": "room_diff", "room": "lobby:1", "joins": {"9": {}}}, 1, set(), set())
    assert views.snapshot() == {}
    state = {"type": "room_state", "room": "lobby:1", "members": {"1": {}, "2": {}}}
    views.apply({**state, "others": 3, "count": 5}, 1, set(), set())
    assert views.pending == set()
    diff = {"type": "room_diff", "room": "lobby:1", "joins": {"4": {}}, "leaves": ["2"]}
    views.apply({**diff, "others": 2, "count": 4}, 1, set(), set())
    assert views.snapshot() == {"lobby:1": (frozenset({"1", "4"}), 2, 4)}


def test_a_hidden_user_listed_to_someone_else_is_a_leak() -> None:
    views = RoomViews()
    views.reset(["lobby:1"])
    state = {"type": "room_state", "room": "lobby:1", "members": {"1": {}, "7": {}}}
    assert views.apply({**state, "others": 0, "count": 2}, 1, {7}, set()) == [7]
    # Oneself is never a leak, nor a hidden user counted in others only.
    assert views.apply({**state, "others": 0, "count": 2}, 7, {7}, set()) == []
    diff = {"type": "room_diff", "room": "lobby:1", "joins": {}, "leaves": [], "others": 1}
    assert views.apply({**diff, "count": 3}, 1, {7}, set()) == []


def test_a_share_of_the_connections_join_a_room_many_of_them_the_big_one() -> None:
    rooms = [assign(index, share=0.3) for index in range(2000)]
    joined = [r for r in rooms if r]
    assert 0.2 < len(joined) / len(rooms) < 0.4
    assert all(len(r) == 1 and r[0].startswith(f"{KIND}:") for r in joined)
    assert 0.35 < sum(r == [BIG] for r in joined) / len(joined) < 0.65
    assert rooms == [assign(index, share=0.3) for index in range(2000)]  # the same every run
    assert not any(assign(index, share=0) for index in range(100))  # off: no rooms


def test_a_user_a_seeded_block_stands_between_listed_is_a_leak_both_ways() -> None:
    views = RoomViews()
    views.reset(["lobby:1"])
    state = {"type": "room_state", "room": "lobby:1", "members": {"1": {}, "5": {}}}
    blocked = {(1, 5), (5, 1)}
    assert views.apply({**state, "others": 0, "count": 2}, 1, set(), blocked) == [5]
    assert views.apply({**state, "others": 0, "count": 2}, 5, set(), blocked) == [1]
    assert views.apply({**state, "others": 0, "count": 2}, 1, set(), set()) == []


def test_rooms_are_in_the_population_by_default() -> None:
    assert pytest.approx(0.3) == loadtest_rooms.SHARE  # LOADTEST_ROOMS unset in the tests
    assert any(assign(index) for index in range(100))


@pytest.mark.django_db
def test_room_keys_left_in_redis_are_found_by_the_key_schemes_names(
    redis_client: redis.Redis, settings: Any
) -> None:
    from presence.conf import get_settings

    scheme = KeyScheme(get_settings())
    assert leftover_keys([redis_client]) == {"room keys": 0, "room schedule entries": 0}
    redis_client.set(scheme.room_key("lobby:big", "n"), "1")
    redis_client.zadd(scheme.room_schedules()[0], {"lobby:big": 1})
    redis_client.set(f"{get_settings().KEY_PREFIX}:{{7}}:seen", "1")  # not a room's
    assert leftover_keys([redis_client]) == {"room keys": 1, "room schedule entries": 1}
    # An emptied room's kept z expires by itself; one that would stay is counted.
    redis_client.set(scheme.room_key("lobby:small-1", "z"), "5", ex=ROOM_Z_KEEP)
    assert leftover_keys([redis_client])["room keys"] == 1
    redis_client.set(scheme.room_key("lobby:small-2", "z"), "5")
    assert leftover_keys([redis_client])["room keys"] == 2


# --- the room check, against room_presence ------------------------------------------------------

#: an empty room as room_presence shows it: no member listed, none other, count 0
EMPTY = (frozenset(), 0, 0)
#: a view listing a member the room does not have
WRONG = (frozenset({"99"}), 0, 1)
SMALL_ROOM = f"{KIND}:small-3"


@pytest.fixture
def lobby_rooms(settings: Any) -> None:
    settings.PRESENCE = {**settings.PRESENCE, **loadtest_rooms.SETTINGS}


@pytest.mark.django_db
def test_each_tab_of_a_user_is_compared_in_its_own_room(lobby_rooms: None, make_user: Any) -> None:
    viewer = make_user().pk
    # Two tabs of one user in different rooms: the first tab's view is wrong.
    views = [(1, viewer, {BIG: WRONG}), (2, viewer, {SMALL_ROOM: EMPTY})]
    result = loadtest_rooms.compare(views, hidden=set(), blocked_pairs=set())
    assert result.views == 2
    assert result.wrong == 1
    assert result.wrong_views == [(1, BIG)]
    assert loadtest_rooms.compare(views[1:], set(), set()).wrong == 0  # the right one alone


@pytest.mark.django_db
def test_a_room_view_the_oracle_gives_no_truth_for_is_wrong(lobby_rooms: None) -> None:
    nobody = 10**9  # no such user: room_presence cannot be asked for them
    result = loadtest_rooms.compare([(1, nobody, {BIG: EMPTY})], set(), set())
    assert (result.views, result.wrong) == (1, 1)
    assert "the oracle gave no view" in loadtest_rooms.report(result)


def test_a_wrong_room_view_stays_wrong_while_its_client_is_not_ready(
    lobby_rooms: None, transactional_db: None
) -> None:
    from django.contrib.auth import get_user_model

    viewer = get_user_model().objects.create_user(username="roomviewer").pk
    looks: list[int] = []

    def ask_views() -> list[loadtest_rooms.RoomViewsOf]:
        # Wrong at the first look; then its client reconnected and its room_state never came
        # (a client not ready sends no view).
        looks.append(1)
        return [(1, viewer, {BIG: WRONG})] if len(looks) == 1 else []

    result = loadtest_rooms.check(ask_views, 1.0, set(), set())
    assert len(looks) > 1
    assert result.first_wrong == 1
    assert result.wrong == 1
    assert result.no_view == 1
    assert result.converged_in is None


def test_a_wrong_room_view_leaves_once_its_client_is_back_and_agrees(
    lobby_rooms: None, transactional_db: None
) -> None:
    from django.contrib.auth import get_user_model

    viewer = get_user_model().objects.create_user(username="roomviewer").pk
    answers = iter([[(1, viewer, {BIG: WRONG})], []])

    def ask_views() -> list[loadtest_rooms.RoomViewsOf]:
        return next(answers, [(1, viewer, {BIG: EMPTY})])

    result = loadtest_rooms.check(ask_views, 2.0, set(), set())
    assert result.first_wrong == 1
    assert result.wrong == 0
    assert result.converged_in is not None
