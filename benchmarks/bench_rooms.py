"""rooms: what a room costs (issue 25), side by side in one run.

1. **Join + leave vs a plain subscribe of one user**, through the consumer: one
   ``PresenceConsumer`` (a ``WebsocketCommunicator``, the real channels_redis layer and Redis)
   alternates (a) ``subscribe [B]`` → ``presence_state``, ``unsubscribe [B]``, and (b) ``join``
   → ``room_state``, ``leave``; each round ends with an empty ``subscribe`` answered in order
   (frames are handled one after another), so both sides are timed to the end of their last
   frame. Rounds interleave; ratio of medians (goal ≤ 2x). Neither side calls the channel
   layer's group_add or group_discard in a round (the subscribe finds B's group joined; the
   join, the room's groups lingering since the last round's leave, as after a page's reload);
   a third side, unjudged, joins a room new to the process each round (its two groups joined,
   then left to linger). Redis-side microseconds of the store paths (``INFO commandstats``
   deltas) beside it.
2. **Redis memory per room member**: a room of N members (10,000; ``--quick`` 1,000) joined
   through the store's own join plan, a millisecond apart as joins come (a read takes the
   members of one millisecond together), each join's outbox entry claimed as its process does
   at once; ``MEMORY USAGE key SAMPLES 0`` of the room's keys / N (goal ≤ 100 B).
3. **A room of 10,000 members**: the store's read of a room's state (its count, the first
   ``ROOM_LIST_LIMIT`` members by join time and the viewer's contacts; goal ≤ 5 ms) and of its
   count alone (goal ≤ 1 ms), medians on the client; ``api.room_presence`` end to end beside
   them (the read, the privacy facts of the listed, the resolver).
4. **The seed's way vs ours for the count**: the same members in a sorted set plus one TTL key
   per member, counted by ``SCAN MATCH`` over the keyspace (what the crash detection by key
   expiry needs), vs ours; the two counts must agree; ratio of medians (goal ≥ 100x).
5. **A burst of joins into one room with viewers**: V viewers (1,000; ``--quick`` 100) have
   joined the room (each one consumer, as above; every socket's opening done first, an empty
   subscribe answered, so that the burst measures the joins, not the openings the process
   admits a few at a time); then J users (1,000; 100) join at once, two
   ways, into two rooms: (a) recorded and announced as each joiner's own process does
   (``_room_events.ajoin_room``, 50 at a time), from 4 other processes started before the
   burst (on a site the joins come from the joiners' processes, not from the process holding
   the views): the fan-out alone, judged; (b) as join frames of consumers
   of this same process, each answered with its own ``room_state``: one process doing both
   sides (its joins batched, presence.rooms.joins). Frames each viewer receives for the burst
   (goal ≤ 5), and the time from the burst's start until each viewer's view (its
   ``room_state`` with every ``room_diff`` applied) shows the right count: p50 / p99 (goal
   p99 ≤ 1 s for (a), ≤ 2 s for (b)) and how many never got right (goal 0). A third row,
   (c), is (b) as a live event's page makes it: J more sockets open and join straight away
   (no subscribe first), their openings admitted a few at a time (presence.admission), the
   time counted from their handshakes.

``BENCH_ROOMS_ONLY=bursts`` runs part 5 alone; ``BENCH_ROOMS_PROFILE=DIR`` writes a cProfile
of this process during each burst (``DIR/burst-<room>.prof``) and of each joiners' process
(``DIR/joiners-<pid>.prof``).
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from benchmarks.bench_fanout import bounded, close_all, make_users, percentile, run_async
from benchmarks.common import (
    Report,
    Sizes,
    activity_scores,
    command_stats,
    fill_buckets,
    flush,
    median,
    ms,
    raw_client,
    say,
    scan_keys,
    store,
)
from presence import api
from presence.conf import get_settings
from presence.hub import Hub
from presence.routing import websocket_urlpatterns

NAME = "rooms"
BASE_ID = 7_000_001
KIND = "lobby"
ROOM = f"{KIND}:bench"
#: the settings of every part: rooms of the kind "lobby" (anyone logged in), everyone visible
#: to everyone (so each viewer lists and counts every member), no frame limit in the way
SETTINGS = {
    "ROOMS": {"lobby": None},
    "DEFAULT_PRIVACY": {"online_visibility": "everyone"},
    "RATE_LIMIT": (1_000_000, 1),
    "SWEEP_INTERVAL": 3600,
    # The benchmark's connections send no heartbeats: their stays must outlast the run, or
    # members would leave (crash detection) while the views are being checked.
    "CONNECTION_TTL": 7200,
}
APP = URLRouter(websocket_urlpatterns)
#: how long the burst's views may take to be right before they count as never right
WAIT_RIGHT = 600
#: the processes recording the burst's joins (as the joiners' own processes on a site)
JOINER_PROCESSES = 4
#: the most room_diff frames a viewer may get for a burst
FRAMES_GOAL = 5
#: BENCH_ROOMS_ONLY=bursts: part 5 alone (a profile of the bursts, a quicker comparison)
BURSTS_ONLY = os.environ.get("BENCH_ROOMS_ONLY") == "bursts"


@contextlib.contextmanager
def profiled(name: str) -> Any:
    """A cProfile of this process while the block runs, in $BENCH_ROOMS_PROFILE/NAME.prof."""
    folder = os.environ.get("BENCH_ROOMS_PROFILE")
    if not folder:
        yield
        return
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        os.makedirs(folder, exist_ok=True)
        profile.dump_stats(os.path.join(folder, f"{name}.prof"))


def pct(values: list[float], q: float) -> float:
    return percentile(values, q) if values else float("inf")


def _execute(commands: list[Any], chunk: int = 500) -> None:
    """Pipelined, for the fill; the scripts must be loaded (a plan run through store.run)."""
    s = store()
    for start in range(0, len(commands), chunk):
        failed = [
            r for r in s._execute(commands[start : start + chunk]) if isinstance(r, Exception)
        ]
        if failed:
            raise failed[0]


def connection_id(uid: int) -> str:
    """As long as the consumer's (16 hex digits), so the entries weigh what real ones do."""
    return f"{uid:016x}"


#: seconds between two members' joins in a room's fill: joins come apart, and a read takes the
#: members of one millisecond together
JOIN_STEP = 0.001


def fill_room(
    room: str, user_ids: list[int], now: float, public: bool = True, step: float = JOIN_STEP
) -> None:
    """Each user joins ``room`` with one connection, through the store's join plan (pipelined),
    the first at ``now``; ``public``: their online status shown to everyone (the room's index of
    such members); ``step``: seconds between joins (0: all in the same millisecond). Each
    join's room_entered is claimed as its process does at once (presence.outbox): the room's
    outbox holds nothing after the fill."""
    s = store()
    first = user_ids[0]
    s.run(s.plans.join_room(room, first, connection_id(first), now, public=public))  # the scripts
    commands: list[Any] = []
    for n, uid in enumerate(user_ids[1:], 1):
        at = now + n * step
        commands += s.plans.join_room(room, uid, connection_id(uid), at, public=public).commands
    _execute(commands)
    raw_client().delete(s.keys.room_key(room, "o"))


def room_bytes(room: str) -> dict[str, int]:
    """``MEMORY USAGE`` of every key of the room (found by SCAN), summed by its part: ``s``
    segments, ``u`` index buckets, the rest (``n``, ``e``, ``g``, ``w``, ``t``, ``v``) as named."""
    client = raw_client()
    base = store().keys.room_key(room, "")
    parts: dict[str, int] = {}
    pattern = re.sub(r"([\\*?\[\]])", r"\\\1", base) + "*"  # the room's name, not a glob
    for key in scan_keys(client, pattern):
        name = key.decode() if isinstance(key, bytes) else key
        part = name[len(base) :].split(":", 1)[0]
        parts[part] = parts.get(part, 0) + int(client.memory_usage(key, samples=0) or 0)
    return parts


def timed_median(fn: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median(times)


# --- 2-4: memory, reads, the seed's count -------------------------------------------------------


def seed_fill(room: str, user_ids: list[int], ttl: int) -> None:
    """The seed's layout: members in a sorted set by join time, a TTL key per member."""
    client = raw_client()
    pipe = client.pipeline(transaction=False)
    now = int(time.time())
    for n, uid in enumerate(user_ids, 1):
        pipe.zadd(f"seed:{room}:members", {str(uid): now})
        pipe.set(f"seed:{room}:member:{uid}", 1, ex=ttl)
        if n % 1000 == 0:
            pipe.execute()
    pipe.execute()


def seed_count(room: str) -> int:
    """The seed's count: the member keys still alive, found by SCAN over the keyspace."""
    client = raw_client()
    return len(scan_keys(client, f"seed:{room}:member:*"))


def redis_parts(report: Report, members: int, viewer: Any) -> None:
    s = store()
    conf = get_settings()
    now = time.time()
    ids = list(range(BASE_ID, BASE_ID + members))
    # Online (seen in the last minute), so that every member may be listed: the read resolves
    # as many as it would in a busy room.
    fill_buckets(raw_client(), s, activity_scores(ids, int(now), 60))
    fill_room(ROOM, ids, now - members * JOIN_STEP)
    parts = room_bytes(ROOM)
    per_member = sum(parts.values()) / members
    say(
        "  (per member, by key: "
        + ", ".join(f"{part} {size / members:.0f} B" for part, size in parts.items())
        + ")"
    )
    report.add(
        NAME,
        f"Redis bytes per room member ({members:,} members)",
        f"{per_member:.0f} B",
        "≤ 100 B",
        per_member <= 100,
    )

    runs = 50
    read = timed_median(
        lambda: s.run(s.plans.read_room(ROOM, time.time(), conf.ROOM_LIST_LIMIT)), runs
    )
    count_plan = lambda: s.run(s.plans.room_count(ROOM, time.time()))  # noqa: E731
    count = timed_median(count_plan, runs * 4)
    assert count_plan() == members, (count_plan(), members)
    report.add(
        NAME,
        f"room state read, {members:,} members (first {conf.ROOM_LIST_LIMIT})",
        ms(read),
        "≤ 5 ms",
        read <= 0.005,
    )
    report.add(NAME, f"room count, {members:,} members", ms(count), "≤ 1 ms", count <= 0.001)
    state = api.room_presence(ROOM, viewer)
    assert state["count"] == members, state["count"]
    end_to_end = timed_median(lambda: api.room_presence(ROOM, viewer), 15)
    report.add(
        NAME,
        f"api.room_presence end to end, {members:,} members ({len(state['members'])} listed)",
        ms(end_to_end),
    )

    seed_fill(ROOM, ids, conf.CONNECTION_TTL)
    assert seed_count(ROOM) == members
    seed = timed_median(lambda: seed_count(ROOM), 5)
    ours = timed_median(count_plan, 20)
    ratio = seed / ours
    report.add(
        NAME,
        f"count: seed's SCAN {ms(seed)} vs ours {ms(ours)}",
        f"{ratio:,.0f}x",
        "≥ 100x",
        ratio >= 100,
    )


# --- 1 and 5: through the consumer ------------------------------------------------------------


class Viewer:
    """One connection, applying room_state and room_diff as presence.js does, room by room;
    stamps when a room's count first reaches its ``targets`` entry."""

    def __init__(self, user: Any) -> None:
        self.comm = WebsocketCommunicator(APP, "/ws/presence/")
        self.comm.scope["user"] = user
        self.counts: dict[str, int] = {}
        self.members: dict[str, set[str]] = {}
        self.diffs: dict[str, int] = {}
        self.targets: dict[str, int] = {}
        self.right_at: dict[str, float] = {}
        #: joins answered "unavailable", joined again
        self.retries = 0
        self._tasks: set[asyncio.Future[None]] = set()
        queue = self.comm.output_queue
        put_nowait = queue.put_nowait

        def stamped(message: dict[str, Any]) -> None:
            text = message.get("text") or ""
            if '"room_' in text:
                self.apply(json.loads(text))
            elif '"unavailable"' in text:
                # A join answered "unavailable" (Redis too busy to read the room in time, as
                # under a storm of joins on a loaded machine) is joined again, as presence.js
                # does.
                frame = json.loads(text)
                if frame.get("room"):
                    self.retries += 1
                    task = asyncio.ensure_future(self.join(frame["room"]))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            put_nowait(message)

        queue.put_nowait = stamped  # type: ignore[method-assign]

    def apply(self, frame: dict[str, Any]) -> None:
        room = frame.get("room", "")
        if frame.get("type") == "room_state":
            self.members[room] = set(frame["members"])
        elif frame.get("type") == "room_diff" and room in self.members:
            self.diffs[room] = self.diffs.get(room, 0) + 1
            self.members[room] -= set(frame.get("leaves") or ())
            self.members[room] |= set(frame.get("joins") or {})
        else:
            return
        self.counts[room] = int(frame["count"])
        if self.counts[room] == self.targets.get(room) and room not in self.right_at:
            self.right_at[room] = time.perf_counter()

    async def open(self) -> None:
        connected, _ = await self.comm.connect(timeout=60)
        if not connected:
            raise RuntimeError("a connection was refused")

    async def opened(self) -> None:
        """Its opening done: an empty subscribe answered (the process admits openings a few
        at a time, presence.admission; a socket waiting for its turn holds its frames)."""
        await self.comm.send_json_to({"type": "subscribe", "users": []})
        await answered(self.comm, "presence_state")

    async def join(self, room: str) -> None:
        await self.comm.send_json_to({"type": "join", "room": room, "meta": None})

    async def open_and_join(self, room: str) -> None:
        """A live event's page: the socket joins straight after its handshake."""
        await self.open()
        await self.join(room)

    def drain(self) -> None:
        while not self.comm.output_queue.empty():
            self.comm.output_queue.get_nowait()


async def answered(comm: WebsocketCommunicator, kind: str) -> dict[str, Any]:
    while True:
        frame = await comm.receive_json_from(timeout=30)
        if frame.get("type") == kind:
            return frame


async def join_vs_subscribe(report: Report, rounds: int, users: list[Any]) -> None:
    me, other = users[0], users[1]
    # B online, so the subscribe resolves a live user (a room member is one too).
    b = Viewer(other)
    await b.open()
    a = WebsocketCommunicator(APP, "/ws/presence/")
    a.scope["user"] = me
    connected, _ = await a.connect(timeout=30)
    assert connected
    client = raw_client()

    async def subscribe_round() -> float:
        start = time.perf_counter()
        await a.send_json_to({"type": "subscribe", "users": [other.pk]})
        await answered(a, "presence_state")
        await a.send_json_to({"type": "unsubscribe", "users": [other.pk]})
        await a.send_json_to({"type": "subscribe", "users": []})
        await answered(a, "presence_state")
        return time.perf_counter() - start

    async def join_round(room: str) -> float:
        start = time.perf_counter()
        await a.send_json_to({"type": "join", "room": room, "meta": None})
        await answered(a, "room_state")
        await a.send_json_to({"type": "leave", "room": room})
        await a.send_json_to({"type": "subscribe", "users": []})
        await answered(a, "presence_state")
        return time.perf_counter() - start

    subs: list[float] = []
    joins: list[float] = []
    fresh: list[float] = []
    usec = {"subscribe": 0, "join": 0, "fresh": 0}
    for n in range(rounds + 2):
        for kind, step, out in (
            ("subscribe", subscribe_round, subs),
            ("join", partial(join_round, "lobby:cost"), joins),
            # A room this process has no group of (none lingering): two channel-layer calls
            # more for the join (the room's group, that of every room view), as the
            # subscribe of a user nobody here watches would pay one.
            ("fresh", partial(join_round, f"lobby:cost-{n}"), fresh),
        ):
            before = sum(u for _, u in command_stats(client).values())
            took = await step()
            after = sum(u for _, u in command_stats(client).values())
            if n >= 2:  # two rounds unmeasured: warm-up
                out.append(took)
                usec[kind] += after - before
    ratio = median(joins) / median(subs)
    report.add(
        NAME,
        f"join+leave {ms(median(joins))} vs subscribe+unsubscribe of one user "
        f"{ms(median(subs))} (median of {rounds})",
        f"{ratio:.2f}x",
        "≤ 2x",
        ratio <= 2,
    )
    report.add(
        NAME,
        f"  join+leave of a room new to this process each time {ms(median(fresh))}",
        f"{median(fresh) / median(subs):.2f}x",
    )
    say(
        f"  (Redis time per round: join+leave {usec['join'] / rounds:.0f} µs, "
        f"subscribe+unsubscribe {usec['subscribe'] / rounds:.0f} µs)"
    )
    await a.disconnect(timeout=10)
    await close_all([b.comm])


async def settle(viewers: list[Viewer], room: str, count: int) -> None:
    """Wait until every viewer shows ``count`` in ``room``, then forget the setup's frames."""
    deadline = time.perf_counter() + WAIT_RIGHT
    while any(v.counts.get(room) != count for v in viewers):
        if time.perf_counter() > deadline:
            shown = Counter(v.counts.get(room) for v in viewers).most_common(5)
            raise RuntimeError(f"the viewers' views of {room} did not settle: counts {shown}")
        await asyncio.sleep(0.05)
    # The setup's last deliveries (the viewers joined at once: windows that resolve many
    # lists with room) end before the burst, which is measured alone.
    hub = Hub.current()
    quiet_since = time.perf_counter()
    while time.perf_counter() - quiet_since < 0.5 and time.perf_counter() < deadline:
        if hub is not None and (hub.rooms.windows.pending or hub.rooms.windows.delivering):
            quiet_since = time.perf_counter()
        await asyncio.sleep(0.05)
    for viewer in viewers:
        viewer.drain()
        viewer.diffs[room] = 0


async def measure_burst(
    report: Report,
    label: str,
    room: str,
    viewers: list[Viewer],
    joins: Callable[[], Any],
    n: int,
    goal: float,
) -> None:
    target = len(viewers) + n
    for viewer in viewers:
        viewer.targets[room] = target
    with profiled(f"burst-{room.replace(':', '-')}"):
        start = time.perf_counter()
        await joins()
        took = ms(time.perf_counter() - start)
        say(f"  ({label}: the {n:,} joins were sent or recorded in {took})")
        deadline = start + WAIT_RIGHT
        while any(room not in v.right_at for v in viewers) and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
    await asyncio.sleep(1.0)  # frames still coming after a view got right count too
    late = [v for v in viewers if room not in v.right_at]
    times = [v.right_at[room] - start for v in viewers if room in v.right_at]
    frames = [v.diffs.get(room, 0) for v in viewers]
    p99 = pct(times, 0.99)
    report.add(
        NAME,
        f"burst of {n:,} joins ({label}), {len(viewers):,} viewers: every view right p50 / p99",
        f"{ms(pct(times, 0.5))} / {ms(p99)}",
        f"p99 ≤ {goal:g} s",
        p99 <= goal,
    )
    report.add(
        NAME,
        f"  room_diff frames per viewer (median / max); views never right within {WAIT_RIGHT} s",
        f"{median(frames):.0f} / {max(frames)}; {len(late)}",
        f"≤ {FRAMES_GOAL}; 0",
        not late and max(frames) <= FRAMES_GOAL,
    )


async def bursts(report: Report, viewers_n: int, joiners_n: int, users: list[Any]) -> None:
    """Three bursts into three rooms with the same viewers (real consumers of this process):
    (a) the joins recorded and announced by other processes, as each joiner's own process
    does (``_room_events.ajoin_room``: the Redis write, then "these users changed in room R"),
    the fan-out alone; (b) the joins as frames of real consumers of this process too, each
    answered with its own room_state (a room read): what one process does for both sides;
    (c) as (b), the joiners' sockets opened in the burst too, each joining straight after
    its handshake."""
    viewers = [Viewer(u) for u in users[:viewers_n]]
    joiners = [Viewer(u) for u in users[viewers_n : viewers_n + joiners_n]]
    newcomers = [Viewer(u) for u in users[viewers_n + joiners_n : viewers_n + 2 * joiners_n]]
    await bounded([v.open for v in viewers + joiners], 20)
    # Every socket's opening done before the bursts: the bursts measure the joins, not the
    # openings the process admits a few at a time (presence.admission).
    await bounded([v.opened for v in viewers + joiners], 50)
    elsewhere, here = f"{KIND}:burst-elsewhere", f"{KIND}:burst-here"
    opening = f"{KIND}:burst-opening"
    for room in (elsewhere, here, opening):
        # All at once: their own joins coalesce too (one by one, each would be a diff to all
        # the viewers before it).
        await asyncio.gather(*(viewer.join(room) for viewer in viewers))
        await settle(viewers, room, viewers_n)
    joiner_ids = [u.pk for u in users[viewers_n : viewers_n + joiners_n]]
    # The joiners' side runs in processes of their own, started (Django set up) before the
    # burst, each with its share of the joiners.
    share = -(-len(joiner_ids) // JOINER_PROCESSES)
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "import django; django.setup(); "
            "from benchmarks.bench_rooms import joiner_process; joiner_process()",
            elsewhere,
            str(joiner_ids[start]),
            str(len(joiner_ids[start : start + share])),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for start in range(0, len(joiner_ids), share)
    ]

    async def said(process: asyncio.subprocess.Process, word: bytes, timeout: float) -> None:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), timeout)
        if line.strip() != word:
            raise RuntimeError(f"a joiners' process said {line!r}, not {word!r}")

    async def recorded_elsewhere() -> None:
        for process in processes:
            assert process.stdin is not None
            process.stdin.write(b"go\n")
        await asyncio.gather(*(p.stdin.drain() for p in processes if p.stdin is not None))
        await asyncio.gather(*(said(p, b"done", WAIT_RIGHT) for p in processes))

    async def joined_here() -> None:
        await asyncio.gather(*(j.join(here) for j in joiners))

    async def opened_and_joined() -> None:
        await asyncio.gather(*(j.open_and_join(opening) for j in newcomers))

    try:
        await asyncio.gather(*(said(p, b"ready", 120) for p in processes))
        await measure_burst(
            report,
            "joins recorded by their own processes",
            elsewhere,
            viewers,
            recorded_elsewhere,
            joiners_n,
            1.0,
        )
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
            await process.wait()
    await measure_burst(
        report,
        "join frames handled by this process too",
        here,
        viewers,
        joined_here,
        joiners_n,
        2.0,
    )
    await measure_burst(
        report,
        "sockets opened and joined at once on this process",
        opening,
        viewers,
        opened_and_joined,
        joiners_n,
        2.0,
    )
    await close_all([v.comm for v in viewers + joiners + newcomers], limit=20)


def joiner_process() -> None:
    """The joiners' side of the burst, in a process of its own (as on a site, where joins come
    from the joiners' processes, not the viewers'): ``ROOM FIRST_ID COUNT`` as arguments; says
    ``ready`` once set up, waits for a line, records and announces the joins as each joiner's
    process does (``_room_events.ajoin_room``, 50 at a time), says ``done``."""
    room_name, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    from django.contrib.auth import get_user_model

    from presence.domain.rooms import Room, parse_room
    from presence.rooms import writes as events

    user_model = get_user_model()
    joiners = [user_model(id=pk) for pk in range(first, first + count)]
    room = parse_room(room_name)

    async def joins() -> None:
        async def into(room: Room) -> None:
            await bounded(
                [
                    partial(events.ajoin_room, u, connection_id(u.pk), room, None, False)
                    for u in joiners
                ],
                50,  # below the store's pool of 100 connections
            )

        # Warmed up as a running process is (its connections to Redis and the channel layer
        # open, the scripts loaded): the same joins into a room nobody watches.
        await into(parse_room(f"{KIND}:warm-up"))
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await into(room)
        await store().aclose()

    with override_settings(PRESENCE=SETTINGS), profiled(f"joiners-{os.getpid()}"):
        run_async(joins())
    print("done", flush=True)


async def socket_parts(report: Report, quick: bool, users: list[Any], n: int) -> None:
    if not BURSTS_ONLY:
        await join_vs_subscribe(report, 20 if quick else 100, users)
    await bursts(report, n, n, users[2 : 2 + 3 * n])
    await store().aclose()


def run(sizes: Sizes, report: Report) -> None:
    quick = report.quick
    members = 1_000 if quick else 10_000
    burst_n = int(os.environ.get("BENCH_ROOMS_BURST", 100 if quick else 1000))
    say(
        f"\n== rooms: join cost, memory, reads and count of a {members:,}-member room, "
        f"a burst of {burst_n:,} joins to {burst_n:,} viewers =="
    )
    flush(raw_client())
    with override_settings(PRESENCE=SETTINGS):
        users = make_users(BASE_ID, max(members, 2 + 3 * burst_n), "room")
        if not BURSTS_ONLY:
            redis_parts(report, members, users[0])
            flush(raw_client())
        run_async(socket_parts(report, quick, users, burst_n))
        flush(raw_client())
    # Free the database for the next benchmark.
    from django.contrib.auth import get_user_model

    get_user_model()._default_manager.filter(pk__gte=BASE_ID, pk__lt=BASE_ID + len(users)).delete()
