"""The load test's rooms (tools/loadtest/rooms.py), free of I/O: a client's view of a room
from room_state and room_diff, leaks of hidden users, who joins which room."""

from __future__ import annotations

from tools.loadtest.rooms import BIG, KIND, RoomViews, assign


def test_a_view_is_its_state_with_each_diff_applied() -> None:
    views = RoomViews()
    views.reset(["lobby:1"])
    assert views.pending == {"lobby:1"}
    # A diff before the room's state is dropped: the state follows and includes it.
    views.apply({"type": "room_diff", "room": "lobby:1", "joins": {"9": {}}}, 1, set())
    assert views.snapshot() == {}
    state = {"type": "room_state", "room": "lobby:1", "members": {"1": {}, "2": {}}}
    views.apply({**state, "others": 3, "count": 5}, 1, set())
    assert views.pending == set()
    diff = {"type": "room_diff", "room": "lobby:1", "joins": {"4": {}}, "leaves": ["2"]}
    views.apply({**diff, "others": 2, "count": 4}, 1, set())
    assert views.snapshot() == {"lobby:1": (frozenset({"1", "4"}), 2, 4)}


def test_a_hidden_user_listed_to_someone_else_is_a_leak() -> None:
    views = RoomViews()
    views.reset(["lobby:1"])
    state = {"type": "room_state", "room": "lobby:1", "members": {"1": {}, "7": {}}}
    assert views.apply({**state, "others": 0, "count": 2}, 1, {7}) == [7]
    # Oneself is never a leak, nor a hidden user counted in others only.
    assert views.apply({**state, "others": 0, "count": 2}, 7, {7}) == []
    diff = {"type": "room_diff", "room": "lobby:1", "joins": {}, "leaves": [], "others": 1}
    assert views.apply({**diff, "count": 3}, 1, {7}) == []


def test_a_share_of_the_connections_join_a_room_many_of_them_the_big_one() -> None:
    rooms = [assign(index, share=0.3) for index in range(2000)]
    joined = [r for r in rooms if r]
    assert 0.2 < len(joined) / len(rooms) < 0.4
    assert all(len(r) == 1 and r[0].startswith(f"{KIND}:") for r in joined)
    assert 0.35 < sum(r == [BIG] for r in joined) / len(joined) < 0.65
    assert rooms == [assign(index, share=0.3) for index in range(2000)]  # the same every run
    assert not any(assign(index, share=0) for index in range(100))  # off: no rooms
