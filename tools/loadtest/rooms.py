"""Rooms in the load test (issue 25): a share of the connections join a room ("lobby:big", which
many join, or one of a few small ones) when they open (and again after each reload), and keep
the room's view they were sent (``room_state``, then each ``room_diff``). At every checkpoint
and at the final check each view is compared with ``presence.api.room_presence`` for that
viewer: the members listed (as a set: the order past the viewer's contacts is by join time),
``others`` and ``count``, exactly. A hidden user (no one may ever see them) or a user a seeded
block stands between listed to anyone else is a leak, counted at once, in the client's frames
and in the oracle's answer alike. Once every client has left and ``presence_cleanup`` ran,
:func:`leftover_keys` finds every room key still in Redis (the key scheme's own names): any is
an orphan, and fails the run.

The hooks: ``ClientSpec.rooms`` (run.plan_clients), the client's ``room_views`` (generator),
the generators' ``room_views`` command, :func:`check` at the checkpoints and the final check,
:func:`leftover_keys` in run.orphans.

By default 30 % of the connections are in rooms, in --quick too; ``LOADTEST_ROOMS=0.5`` sets
another share, ``LOADTEST_ROOMS=0`` leaves rooms out (presence alone, as runs before rooms).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tools.loadtest.oracle_thread import ORACLE_SHARE, RECHECK, in_oracle_thread
from tools.redis_server import scan_keys

#: the kind the servers declare (anyone logged in may enter)
KIND = "lobby"
SETTINGS = {"ROOMS": {KIND: None}}
BIG = f"{KIND}:big"
SMALL = 5
#: share of the connections in a room (LOADTEST_ROOMS; 0: rooms are left out); of those, the
#: share in the big one
SHARE = float(os.environ.get("LOADTEST_ROOMS") or 0.3)
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

    def apply(
        self,
        frame: dict[str, Any],
        viewer: int,
        hidden: set[int],
        blocked_pairs: set[tuple[int, int]],
    ) -> list[int]:
        """Apply a room frame; the users it lists that this viewer may never see (leaks): the
        hidden ones and those a seeded block stands between (both ways in ``blocked_pairs``)."""
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
        return [int(m) for m in listed if never_shown(viewer, int(m), hidden, blocked_pairs)]

    def snapshot(self) -> dict[str, RoomTuple]:
        return {
            room: (frozenset(view["members"]), view["others"], view["count"])
            for room, view in self.views.items()
        }


def never_shown(
    viewer: int, member: int, hidden: set[int], blocked_pairs: set[tuple[int, int]]
) -> bool:
    """Whether listing ``member`` to ``viewer`` is a leak whatever else happened in the run."""
    return member != viewer and (member in hidden or (viewer, member) in blocked_pairs)


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
    #: views differing at the first comparison (the last changes still being coalesced)
    first_wrong: int = 0
    wrong: int = 0
    #: members listed by the oracle (room_presence) that the viewer may never see
    oracle_leaks: int = 0
    #: (viewer, room, shown, the oracle's; None: it gave none) of views found wrong
    examples: list[tuple[int, str, RoomTuple, RoomTuple | None]] = field(default_factory=list)
    #: (connection index, room) of the views found wrong
    wrong_views: list[tuple[int, str]] = field(default_factory=list)
    #: of the views wrong at the end, those whose client sent none at the last look (not ready)
    no_view: int = 0
    converged_in: float | None = None
    #: by room: the members present as the oracle counts them for one viewer (the largest
    #: count any viewer of it saw), for the summary's figures
    sizes: dict[str, int] = field(default_factory=dict)


def compare(
    views: Iterable[RoomViewsOf], hidden: set[int], blocked_pairs: set[tuple[int, int]]
) -> RoomCheck:
    views = list(views)
    # Every room of each viewer: a user's tabs may be in different rooms.
    rooms: dict[int, list[str]] = {}
    for _, viewer, shown in views:
        rooms[viewer] = sorted({*rooms.get(viewer, ()), *shown})
    truth = expected(rooms, rooms)
    result = RoomCheck()
    for (viewer, room), (listed, _others, count) in truth.items():
        result.oracle_leaks += sum(
            1 for member in listed if never_shown(viewer, int(member), hidden, blocked_pairs)
        )
        result.sizes[room] = max(result.sizes.get(room, 0), count)
    for index, viewer, shown in views:
        for room, view in shown.items():
            result.views += 1
            # A view the oracle gave no truth for is not right either.
            right = truth.get((viewer, room))
            if view != right:
                result.wrong += 1
                result.wrong_views.append((index, room))
                if len(result.examples) < 3:
                    result.examples.append((viewer, room, view, right))
    return result


def check(
    ask_views: Callable[[], Iterable[RoomViewsOf]],
    bound: float,
    hidden: set[int],
    blocked_pairs: set[tuple[int, int]],
    sample: int | None = None,
) -> RoomCheck:
    """Compare every client's room views (or those of ``sample`` clients drawn at random: a
    checkpoint's) with the oracle until they agree or ``bound`` seconds have passed (the last
    joins and leaves of the run are still being coalesced). The oracle's reads run in the
    harness's thread of lower priority, at most a quarter of the time."""

    started = time.monotonic()
    first: RoomCheck | None = None
    chosen: set[int] | None = None
    #: (connection index, room) of the views found wrong, until each is seen to agree
    wrong: set[tuple[int, str]] = set()
    while True:
        views = list(ask_views())
        if sample is not None:
            if chosen is None:
                clients = sorted({index for index, _, _ in views})
                chosen = set(random.sample(clients, min(sample, len(clients))))
            views = [view for view in views if view[0] in chosen]
        reading = time.monotonic()
        result = in_oracle_thread(compare, views, hidden, blocked_pairs)
        pause = max(RECHECK, (time.monotonic() - reading) * (1 - ORACLE_SHARE) / ORACLE_SHARE)
        # A wrong view leaves only once it came back and agreed: a client not ready meanwhile
        # (reconnecting, awaiting its room_state) sends none, and it stays wrong until it does.
        returned = {index for index, _, _ in views}
        unseen = {key for key in wrong if key[0] not in returned}
        wrong = unseen | set(result.wrong_views)
        result.wrong, result.no_view = len(wrong), len(unseen)
        first = first or result
        result.first_wrong = first.wrong
        result.oracle_leaks = max(result.oracle_leaks, first.oracle_leaks)
        if not result.wrong:
            result.converged_in = time.monotonic() - started
            return result
        if time.monotonic() - started > bound:
            return result
        time.sleep(pause)


def report(result: RoomCheck, label: str = "final") -> str:
    converged = "n/a" if result.converged_in is None else f"{result.converged_in:.1f} s"
    line = (
        f"loadtest: rooms ({label}): {result.views} room views, {result.first_wrong} differing "
        f"at first, {result.wrong} wrong (converged in {converged}), "
        f"{result.oracle_leaks} oracle leaks"
    )
    if result.no_view:
        line += f" ({result.no_view} of them with no view at the last look: not ready)"
    for viewer, room, shown, right in result.examples if result.wrong else []:
        if right is None:
            line += f"\nloadtest:   wrong: viewer {viewer} room {room}: the oracle gave no view"
            continue
        line += (
            f"\nloadtest:   wrong: viewer {viewer} room {room}: shown "
            f"{len(shown[0])} listed/{shown[1]} others/{shown[2]}, oracle "
            f"{len(right[0])}/{right[1]}/{right[2]}; listed only in the view "
            f"{sorted(shown[0] - right[0])}, only by the oracle {sorted(right[0] - shown[0])}"
        )
    return line


def diagnose(result: RoomCheck, changes: list[tuple[float, str, int, int]]) -> str:
    """For the wrong views' differing members: how the oracle sees them now, their privacy,
    and the harness's relation changes that touched them (a view that missed one of those
    points at that kind of change)."""
    from presence import api
    from presence.models import PrivacySettings

    lines = []
    for viewer, room, shown, right in result.examples:
        for member in sorted(shown[0] ^ (right[0] if right else frozenset())):
            uid = int(member)
            presence = api.get_presence(uid, viewer)
            privacy = PrivacySettings.objects.filter(user_id=uid).values_list(
                "online_visibility", "invisible"
            )
            touched = [
                f"{kind} {a}->{b} at -{time.time() - at:.1f} s"
                for at, kind, a, b in changes
                if uid in (a, b)
            ]
            where = "only in the view" if member in shown[0] else "only by the oracle"
            lines.append(
                f"loadtest:   viewer {viewer} room {room} member {uid}: listed {where}; oracle "
                f"presence {presence.status}, privacy {list(privacy)}; changes {touched}"
            )
    return "\n".join(lines)


def reannounced(
    result: RoomCheck,
    ask_views: Callable[[], Iterable[RoomViewsOf]],
    bound: float,
    hidden: set[int],
    blocked_pairs: set[tuple[int, int]],
) -> str:
    """For the diagnosis only, once a check ended with views wrong: the differing members of
    the examples announced again to their rooms, then compared again for up to ``bound``
    seconds. Views that agree then missed an announcement; views that do not are computed
    wrong from what Redis and the database hold."""
    from asgiref.sync import async_to_sync

    from presence import announce

    targets: dict[str, set[int]] = {}
    for _, room, shown, right in result.examples:
        listed = right[0] if right else frozenset()
        targets.setdefault(room, set()).update(int(m) for m in shown[0] ^ listed)
    if not targets:
        return "loadtest:   (no differing member to announce again)"
    for room, members in targets.items():
        async_to_sync(announce.aannounce_room)(room, members)
    announced = time.monotonic()
    again = check(ask_views, bound, hidden, blocked_pairs)
    named = {room: sorted(members) for room, members in targets.items()}
    if not again.wrong:
        return (
            f"loadtest:   they agreed {time.monotonic() - announced:.1f} s after {named} were "
            "announced again (a missed announcement)"
        )
    return f"loadtest:   {again.wrong} still wrong after {named} were announced again"


def row(result: RoomCheck, joined: int, connections: int) -> str:
    """The summary's figures of the rooms at the final check."""
    big = result.sizes.get(BIG, 0)
    small = sorted(count for room, count in result.sizes.items() if room != BIG)
    converged = "n/a" if result.converged_in is None else f"{result.converged_in:.1f} s"
    return (
        f"{joined} of {connections} connections ({joined / max(1, connections):.0%}); "
        f"{BIG} {big} present, {len(small)} small rooms "
        f"{'/'.join(str(c) for c in small) or '-'}; {result.views} views, "
        f"{result.first_wrong} differing at first, {result.wrong} wrong (converged in "
        f"{converged})"
    )


# --- no room key left behind ------------------------------------------------------------------


def key_patterns() -> tuple[list[str], list[str]]:
    """From the key scheme itself (presence.store.keys): glob patterns matching every room's
    keys, and the room schedules' keys (which may stay, but empty)."""
    from presence.conf import get_settings
    from presence.store.keys import KeyScheme

    scheme = KeyScheme(get_settings())
    # A room name of "*" makes the scheme's own names into patterns (the hash tag's braces
    # are plain characters to SCAN's MATCH); every part of a room, whatever its name.
    patterns = {scheme.room_key("*", "*")}
    return sorted(patterns), list(scheme.room_schedules())


def leftover_keys(nodes: Iterable[Any], quiet: bool = False) -> dict[str, int]:
    """Room keys still in Redis (``nodes``: a client per server, the masters of a cluster):
    ``{"room keys": n, "room schedule entries": m}``, with a few of their names printed. An
    emptied room's kept ``:z`` that expires within ROOM_Z_KEEP seconds goes by itself: not
    counted; nor is the schedule entry of a room with no key left that falls due within the
    outbox's deadline (a sweep that empties a room keeps it due until its batch of leaves is
    past the deadline, in case its claim never came: the room's next sweep drops it)."""
    from presence.conf import get_settings
    from presence.store.keys import ROOM_Z_KEEP, KeyScheme
    from presence.store.plans.outbox import outbox_deadline

    patterns, schedules = key_patterns()
    scheme = KeyScheme(get_settings())
    soon = time.time() + outbox_deadline(get_settings()) + 2
    nodes = list(nodes)

    def kept(node: Any, key: Any) -> bool:
        return _text(key).endswith(":z") and 0 < node.ttl(key) <= ROOM_Z_KEEP

    def has_keys(room: str) -> bool:
        pattern = scheme.room_key(glob_escape(room), "*")
        return any(not kept(node, key) for node in nodes for key in scan_keys(node, pattern))

    found = {"room keys": 0, "room schedule entries": 0}
    names: list[str] = []
    for node in nodes:
        for pattern in patterns:
            for key in scan_keys(node, pattern):
                if kept(node, key):
                    continue
                found["room keys"] += 1
                if len(names) < 5:
                    names.append(_text(key))
        for schedule in schedules:
            try:
                entries = node.zrange(schedule, 0, -1, withscores=True)
            except Exception:  # another master's slot on a cluster: that master counts it
                continue
            for room, due in entries:
                if due <= soon and not has_keys(_text(room)):
                    continue
                found["room schedule entries"] += 1
    if names and not quiet:
        print(f"loadtest: room keys left behind, e.g. {names}", flush=True)
    return found


def glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _text(key: str | bytes) -> str:
    return key if isinstance(key, str) else key.decode()
