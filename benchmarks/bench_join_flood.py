"""join_flood: joins of a big room by a viewer who sees few of its members, as fast as
RATE_LIMIT allows, against another user's join (issue 34, item 3).

A room of 5,000 members (``--quick``: 5,000 too; the read's depth, not the size, is the cost)
at default privacy: a stranger sees none of them, so each read of the room for them goes down
to 32 x ROOM_LIST_LIMIT members (3,200) before it stops. One account (the attacker) holds 4
sockets; each sends joins as fast as the default RATE_LIMIT (60 frames per 10 s) lets it without
being closed: it keeps the server's count of its frames (presence.consumers.limits.RateLimit)
and charges itself what docs/rooms.md says a join counts. Meanwhile another user (the victim)
joins a small room and leaves it, 2.5 times a second: the time from its ``join`` to its
``room_state`` is what is measured. All sockets are ``WebsocketCommunicator``s of this one
process (real channel layer, real Redis, SQLite): the attack and the victim share its event
loop and database thread, as on a site's process.

Phases, side by side in one run:
1. idle: the victim alone;
2. re-joins: each attacker socket joins the big room again and again (what replaced its meta);
3. join + leave: each attacker socket joins the big room, leaves, joins (a full read each time),
   charged by the members resolved (one frame per ``ROOM_MEMBERS_PER_FRAME``);
4. join + leave with the charge switched off (``ROOM_MEMBERS_PER_FRAME`` patched to a
   billion: every join counts one frame): what the charge protects from.

The victim's median under phases 2 and 3 over its idle median: goal <= 2x. On a checkout
without the charge (before issue 34) the benchmark runs phases 2 and 3 as they were (each join
one frame, each re-join a full read).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from channels.testing import WebsocketCommunicator
from django.test import override_settings

from benchmarks.bench_fanout import close_all, make_users, run_async
from benchmarks.bench_rooms import APP, JOIN_STEP, fill_room
from benchmarks.common import (
    ID_RANGES,
    Report,
    Sizes,
    activity_scores,
    fill_buckets,
    flush,
    median,
    ms,
    raw_client,
    say,
    store,
)
from presence.consumers import limits

NAME = "join_flood"
BASE_ID = ID_RANGES[NAME].start
BIG = "lobby:big"
SMALL = "lobby:small"
MEMBERS = 5_000
SOCKETS = 4
SETTINGS = {
    "ROOMS": {"lobby": None},
    "SWEEP_INTERVAL": 3600,
    # The members' stays must outlast the run (they send no heartbeats).
    "CONNECTION_TTL": 7200,
}
#: the victim's rounds per phase, one every VICTIM_EVERY seconds (2 frames each: within
#: RATE_LIMIT)
ROUNDS = 40
#: ``--quick``: a smoke of every phase (its medians are not judged)
QUICK_ROUNDS = 8
VICTIM_EVERY = 0.4
#: attacker rounds before the victim starts measuring (the attack at full speed)
WARM_UP = 1.0


def join_weight(state: dict[str, Any], first: bool) -> int:
    """What docs/rooms.md says this join counted against RATE_LIMIT: a join of a room the
    connection is in, one frame; a first join, one per ROOM_MEMBERS_PER_FRAME members its read
    resolved (a viewer listing fewer than ROOM_LIST_LIMIT read down to 32 x ROOM_LIST_LIMIT)."""
    per_frame = getattr(limits, "ROOM_MEMBERS_PER_FRAME", None)
    if not first or per_frame is None:
        return 1
    from presence.conf import get_settings

    limit = get_settings().ROOM_LIST_LIMIT
    resolved = min(state["count"], 32 * limit) if len(state["members"]) < limit else 2 * limit
    return max(1, resolved // per_frame)


class Attacker:
    """One socket of the attacker: joins (``rejoin``) or joins and leaves the big room as fast
    as RATE_LIMIT lets it, counting its frames as the server does."""

    def __init__(self, user: Any, rejoin: bool) -> None:
        from presence.conf import get_settings

        self.user = user
        self.rejoin = rejoin
        frames, seconds = get_settings().RATE_LIMIT
        # A second more than the server's window: the server counts a frame when it arrives,
        # later than it was sent.
        self.rate = limits.RateLimit(frames, seconds + 1)
        self.comm: WebsocketCommunicator | None = None
        self.joins = 0
        self.closed = 0

    async def connect(self) -> None:
        self.comm = WebsocketCommunicator(APP, "/ws/presence/")
        self.comm.scope["user"] = self.user
        connected, _ = await self.comm.connect(timeout=60)
        assert connected
        self.rate = limits.RateLimit(self.rate.frames, self.rate.seconds)
        self.joined = False

    async def frame(self, frame: dict[str, Any]) -> None:
        while not self.rate.allow(time.time()):
            await asyncio.sleep(0.05)
        assert self.comm is not None
        await self.comm.send_json_to(frame)

    async def run(self, running: Callable[[], bool]) -> None:
        await self.connect()
        while running():
            if self.joined and not self.rejoin:
                await self.frame({"type": "leave", "room": BIG})
                self.joined = False
            await self.frame({"type": "join", "room": BIG, "meta": {"n": self.joins}})
            state = await self.answer()
            if state is None:
                self.closed += 1  # charged more than counted: closed (4429), comes back
                await self.connect()
                continue
            self.joins += 1
            self.rate.charge(time.time(), join_weight(state, not self.joined) - 1)
            self.joined = True

    async def answer(self) -> dict[str, Any] | None:
        """The join's room_state (the room_diffs before it skipped), or None: closed."""
        assert self.comm is not None
        while True:
            output = await self.comm.receive_output(timeout=120)
            if output["type"] == "websocket.close":
                return None
            frame: dict[str, Any] = json.loads(output["text"])
            if frame.get("type") == "room_state":
                return frame


async def victim_rounds(comm: WebsocketCommunicator, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        await comm.send_json_to({"type": "join", "room": SMALL, "meta": None})
        while (await comm.receive_json_from(timeout=120)).get("type") != "room_state":
            pass
        times.append(time.perf_counter() - start)
        await comm.send_json_to({"type": "leave", "room": SMALL})
        await asyncio.sleep(max(0.0, VICTIM_EVERY - times[-1]))
    return times


async def phase(
    victim: WebsocketCommunicator, attacker: Any, rejoin: bool | None, rounds: int
) -> dict[str, Any]:
    """The victim's join times while the attacker's sockets attack (``rejoin`` None: idle)."""
    if rejoin is None:
        return {"times": await victim_rounds(victim, rounds), "rate": 0.0, "closed": 0}
    sockets = [Attacker(attacker, rejoin) for _ in range(SOCKETS)]
    stop = False
    tasks = [asyncio.ensure_future(s.run(lambda: not stop)) for s in sockets]
    started = time.perf_counter()
    try:
        await asyncio.sleep(WARM_UP)
        times = await victim_rounds(victim, rounds)
    finally:
        stop = True
        took = time.perf_counter() - started
        await asyncio.gather(*tasks, return_exceptions=True)
        await close_all([s.comm for s in sockets if s.comm is not None])
    joins = sum(s.joins for s in sockets)
    closed = sum(s.closed for s in sockets)
    return {"times": times, "rate": joins / took, "closed": closed}


@contextmanager
def charge(on: bool) -> Iterator[None]:
    """The charge by members resolved as it is, or switched off (every join one frame)."""
    before = getattr(limits, "ROOM_MEMBERS_PER_FRAME", None)
    if before is not None and not on:
        limits.ROOM_MEMBERS_PER_FRAME = 10**9
    try:
        yield
    finally:
        if before is not None:
            limits.ROOM_MEMBERS_PER_FRAME = before


async def measure(report: Report, users: list[Any]) -> None:
    attacker, victim_user = users[0], users[1]
    victim = WebsocketCommunicator(APP, "/ws/presence/")
    victim.scope["user"] = victim_user
    assert (await victim.connect(timeout=60))[0]
    await victim_rounds(victim, 5)  # warm-up
    rounds = QUICK_ROUNDS if report.quick else ROUNDS
    idle = await phase(victim, attacker, None, rounds)
    idle_median = median(idle["times"])
    report.add(NAME, f"victim's join, idle (median of {rounds})", ms(idle_median))
    has_charge = hasattr(limits, "ROOM_MEMBERS_PER_FRAME")
    phases: list[tuple[str, bool, bool, bool]] = [
        ("re-joins of the big room", True, True, True),
        ("join + leave of the big room, charged", False, True, True),
    ]
    if has_charge:
        phases.append(("join + leave, the charge switched off", False, False, False))
    else:
        say("  (no charge in this checkout: each join counts one frame)")
    for label, rejoin, on, judged in phases:
        with charge(on):
            result = await phase(victim, attacker, rejoin, rounds)
        under = median(result["times"])
        ratio = under / idle_median
        report.add(
            NAME,
            f"victim's join under attack, {label}: {ms(under)} vs idle {ms(idle_median)} "
            f"(attacker: {result['rate']:.1f} joins/s answered, {result['closed']} closed)",
            f"{ratio:.2f}x",
            "≤ 2x" if judged else "",
            ratio <= 2 if judged else None,
        )
    await close_all([victim])
    await store().aclose()


def run(sizes: Sizes, report: Report) -> None:
    say(
        f"\n== join_flood: {SOCKETS} sockets of one account joining a {MEMBERS:,}-member room "
        f"(whose members it may not see) as fast as RATE_LIMIT allows, vs another user's join =="
    )
    flush(raw_client())
    with override_settings(PRESENCE=SETTINGS):
        users = make_users(BASE_ID, MEMBERS + 10, "flood")
        members = [u.pk for u in users[10:]]
        now = time.time()
        fill_buckets(raw_client(), store(), activity_scores(members, int(now), 60))
        fill_room(BIG, members, now - len(members) * JOIN_STEP)
        fill_room(SMALL, [u.pk for u in users[2:6]], now)
        run_async(measure(report, users))
        flush(raw_client())
    from django.contrib.auth import get_user_model

    get_user_model()._default_manager.filter(pk__gte=BASE_ID, pk__lt=BASE_ID + len(users)).delete()
