"""Rooms in the load test (issue 25): a share of the connections join a room ("lobby:big", which
many join, or one of a few small ones) when they open, and keep the room's view they were sent
(``room_state``, then each ``room_diff``). At the final check each view is compared with
``presence.api.room_presence`` for that viewer: the members listed (as a set: the order past
the viewer's contacts is by join time), ``others`` and ``count``. A hidden user (no one may ever
see them) listed to anyone else is a leak, counted at once.

The hooks: ``ClientSpec.rooms`` (run.plan_clients), the client's ``room_views`` (generator),
the generators' ``room_views`` command, and :func:`check` after the final checkpoint.

Opt-in for now: ``LOADTEST_ROOMS=0.3 make loadtest`` puts that share of the connections in
rooms (default 0: none, so the capacity figures of earlier runs stay comparable). It has only
run on a machine saturated by other work, where presence's own views were late too.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: the kind the servers declare (anyone logged in may enter)
KIND = "lobby"
SETTINGS = {"ROOMS": {KIND: None}}
BIG = f"{KIND}:big"
SMALL = 5
#: share of the connections in a room (LOADTEST_ROOMS; 0: rooms are left out); of those, the
#: share in the big one
SHARE = float(os.environ.get("LOADTEST_ROOMS") or 0)
BIG_SHARE = 0.5

#: what a view of a room is compared by: the members listed, others, count
RoomTuple = tuple[frozenset[str], int, int]
#: (connection index, viewer, {room: view})
RoomViewsOf = tuple[int, int, dict[str, RoomTuple]]


def assign(index: int, share: float | None = None) -> list[str]:
    """The rooms connection ``index`` joins: none, the big one, or a small one (drawn from its
    own seed, so that the run's other draws stay as they were)."""
    share = SHARE if share is None else share
    rng = random.Random(25_000 + index)
    if rng.random() >= share:
        return []
    if rng.random() < BIG_SHARE:
        return [BIG]
    return [f"{KIND}:small-{rng.randrange(SMALL)}"]


class RoomViews:
    """A client's view of its rooms, as presence.js keeps it."""

    def __init__(self) -> None:
        self.views: dict[str, dict[str, Any]] = {}
        self.pending: set[str] = set()

    def reset(self, rooms: Iterable[str]) -> None:
        self.views = {}
        self.pending = set(rooms)

    def apply(self, frame: dict[str, Any], viewer: int, hidden: set[int]) -> list[int]:
        """Apply a room frame; the hidden users it lists (leaks)."""
        room = frame.get("room")
        if not isinstance(room, str):
            return []
        if frame.get("type") == "room_state":
            members = set(frame.get("members") or {})
            self.pending.discard(room)
        elif room in self.views:
            members = set(self.views[room]["members"])
            members -= {str(m) for m in frame.get("leaves") or ()}
            members |= set(frame.get("joins") or {})
        else:
            return []  # a diff before its state: the state follows
        self.views[room] = {
            "members": members,
            "others": int(frame.get("others") or 0),
            "count": int(frame.get("count") or 0),
        }
        listed = (frame.get("members") or frame.get("joins") or {}).keys()
        return [int(m) for m in listed if int(m) != viewer and int(m) in hidden]

    def snapshot(self) -> dict[str, RoomTuple]:
        return {
            room: (frozenset(view["members"]), view["others"], view["count"])
            for room, view in self.views.items()
        }


def expected(viewers: Iterable[int], rooms: Mapping[int, Iterable[str]]) -> dict[Any, RoomTuple]:
    """By (viewer, room): the room as ``room_presence`` shows it to that viewer now."""
    from django.contrib.auth import get_user_model

    from presence.api import room_presence

    users = get_user_model()._default_manager.in_bulk(list(viewers))
    result: dict[Any, RoomTuple] = {}
    for pk, user in users.items():
        for room in rooms.get(pk, ()):
            state = room_presence(room, user)
            result[(pk, room)] = (frozenset(state["members"]), state["others"], state["count"])
    return result


@dataclass
class RoomCheck:
    views: int = 0
    wrong: int = 0
    examples: list[tuple[int, str, RoomTuple, RoomTuple]] = field(default_factory=list)
    converged_in: float | None = None


def compare(views: Iterable[RoomViewsOf]) -> RoomCheck:
    views = list(views)
    rooms = {viewer: list(shown) for _, viewer, shown in views}
    truth = expected(rooms, rooms)
    result = RoomCheck()
    for _, viewer, shown in views:
        for room, view in shown.items():
            result.views += 1
            right = truth.get((viewer, room))
            if right is not None and view != right:
                result.wrong += 1
                if len(result.examples) < 3:
                    result.examples.append((viewer, room, view, right))
    return result


def check(ask_views: Callable[[], Iterable[RoomViewsOf]], bound: float) -> RoomCheck:
    """Compare every client's room views with the oracle until they agree or ``bound``
    seconds have passed (the last joins and leaves of the run are still being coalesced)."""
    started = time.monotonic()
    while True:
        result = compare(ask_views())
        if not result.wrong:
            result.converged_in = time.monotonic() - started
            return result
        if time.monotonic() - started > bound:
            return result
        time.sleep(0.5)


def report(result: RoomCheck) -> str:
    converged = "n/a" if result.converged_in is None else f"{result.converged_in:.1f} s"
    line = (
        f"loadtest: rooms: {result.views} room views, {result.wrong} wrong "
        f"(converged in {converged})"
    )
    for viewer, room, shown, right in result.examples if result.wrong else []:
        line += (
            f"\nloadtest:   wrong: viewer {viewer} room {room}: shown "
            f"{len(shown[0])} listed/{shown[1]} others/{shown[2]}, oracle "
            f"{len(right[0])}/{right[1]}/{right[2]}"
        )
    return line
