"""room_rules: what asking rooms' rules again for members already inside costs a process
(issue 34), side by side in one run.

A process holds the connections of U users (1,000; ``--quick`` 200), two each, in rooms of a
kind whose rule makes one indexed query (the user's row, as a site's "is a member of this
group" does), U / 10 users per room. Each round times, interleaved (medians of the rounds):

(a) **the pass** (``presence.hub.room_rules.RoomRules.recheck``, as its loop runs it once per
    HEARTBEAT_INTERVAL): one rule call per (user, room) whatever the number of connections, all
    in one trip to the database's thread; everyone allowed, so nothing is written;
(b) **per connection**: each connection asks its rule in a trip of its own (what asking on
    each connection's heartbeat would cost);
(c) **the rule alone**: the site's rule called once per (user, room) in a plain loop, one trip
    (what no implementation can undercut: the pass's own cost is what it adds to this).

Printed: the three in wall time, their ratios, the pass's CPU time per 1,000 members, and its
share of one core at the default HEARTBEAT_INTERVAL (30 s).
"""

from __future__ import annotations

import time
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.test import override_settings

from benchmarks.bench_fanout import make_users, run_async
from benchmarks.common import Report, Sizes, median, ms, say
from presence.api._rooms import may_enter
from presence.domain.rooms import parse_room
from presence.hub.registry import Registry
from presence.hub.room_rules import RoomRules

NAME = "room_rules"
BASE_ID = 8_000_001
SETTINGS = {"ROOMS": {"group": "benchmarks.bench_room_rules.one_query"}}
#: connections per user in the room, and users per room (U / PER_ROOM rooms)
CONNECTIONS = 2
USERS_PER_ROOM = 100
DEFAULT_INTERVAL = 30


def one_query(user: Any, room_id: str) -> bool:
    """A site's rule: one indexed query (the user's row)."""
    return bool(get_user_model()._default_manager.filter(pk=user.pk, is_active=True).exists())


class Member:
    """A connection in a room, as the pass sees it (never refused here)."""

    def __init__(self, user: Any, n: int) -> None:
        self.user = user
        self.viewer_id = user.pk
        self.connection_id = f"c{user.pk}-{n}"

    async def drop_room(self, name: str) -> bool:
        return True

    async def tell_refused(self, name: str) -> None:
        return None


def _rule_alone(asks: list[tuple[Any, str]]) -> None:
    for user, room_id in asks:
        assert one_query(user, room_id)


async def rounds(users: list[Any], runs: int) -> dict[str, list[float]]:
    registry = Registry()
    connections: list[tuple[Member, str]] = []
    for i, user in enumerate(users):
        room = f"group:{i // USERS_PER_ROOM}"
        for n in range(CONNECTIONS):
            member = Member(user, n)
            registry.rooms.add(cast(Any, member), room)
            connections.append((member, room))
    rules = RoomRules(registry)
    asks = [(user, str(i // USERS_PER_ROOM)) for i, user in enumerate(users)]
    timings: dict[str, list[float]] = {"pass": [], "pass_cpu": [], "single": [], "alone": []}
    for _ in range(runs):
        started, cpu = time.perf_counter(), time.process_time()
        refused = await rules.recheck()
        timings["pass"].append(time.perf_counter() - started)
        timings["pass_cpu"].append(time.process_time() - cpu)
        assert refused == 0
        started = time.perf_counter()
        for member, room in connections:
            assert await sync_to_async(may_enter)(member.user, parse_room(room))
        timings["single"].append(time.perf_counter() - started)
        started = time.perf_counter()
        await sync_to_async(_rule_alone)(asks)
        timings["alone"].append(time.perf_counter() - started)
    return timings


def run(sizes: Sizes, report: Report) -> None:
    quick = report.quick
    count = 200 if quick else 1_000
    runs = 5 if quick else 15
    say(
        f"\n== room_rules: the rules asked again for {count:,} members "
        f"({CONNECTIONS} connections each) of {count // USERS_PER_ROOM} rooms, one query a call =="
    )
    with override_settings(PRESENCE=SETTINGS):
        users = make_users(BASE_ID, count, "rule")
        timings = run_async(rounds(users, runs))
    a, b, c = (median(timings[k]) for k in ("pass", "single", "alone"))
    cpu_per_thousand = median(timings["pass_cpu"]) * 1000 / count
    n = count * CONNECTIONS
    report.add(NAME, f"(a) a pass over {count:,} members (one trip, {count:,} calls)", ms(a))
    report.add(NAME, f"(b) per connection ({n:,} trips, {n:,} calls)", ms(b))
    report.add(NAME, f"(c) the rule alone ({count:,} calls, one trip)", ms(c))
    report.add(NAME, "(b) / (a): per connection vs the pass", f"{b / a:.1f}x")
    report.add(NAME, "(a) / (c): the pass vs its rule calls", f"{a / c:.2f}x")
    report.add(NAME, "the pass's CPU per 1,000 members", ms(cpu_per_thousand))
    report.add(
        NAME,
        f"one core's share per 1,000 members, a pass per {DEFAULT_INTERVAL} s",
        f"{cpu_per_thousand / DEFAULT_INTERVAL:.2%}",
    )
    get_user_model()._default_manager.filter(pk__gte=BASE_ID, pk__lt=BASE_ID + count).delete()
