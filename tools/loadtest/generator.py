"""The load generator: processes of their own, each holding thousands of real WebSocket clients
(the ``websockets`` library) and making real HTTP requests to the daphne processes.

Each client keeps the view it was sent (snapshot, then diffs), beats at HEARTBEAT_INTERVAL, and
on the scheduler's draw reloads, closes its tab for a while, switches idle/active, changes its
status (the text carries the change's time, so that every subscriber measures the fan-out
latency on the one clock of this machine) or views a page over HTTP (through the middleware).
A frame revealing anything of a user the viewer may never see is counted as a leak at once.

The harness drives a generator through a pipe: ``pause``/``resume`` the behaviours (each answered
with the sockets opened so far), ``views``
(what each client was shown), ``beats`` (the latest heartbeat each user sent), ``stats``,
``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import quote

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tools.loadtest.rooms import RoomViews, RoomViewsOf

#: ids per subscribe frame (a frame of up to 100 ids costs one of the rate limit)
SUBSCRIBE_CHUNK = 100
#: clients opening at once (the handshakes of thousands would only time out)
OPENING_AT_ONCE = 100
TICK = 0.1
#: the event loop's lateness is sampled this often (seconds)
LAG_TICK = 0.5
#: how long the opening storm may take to pass before the load starts anyway
OPENING_SETTLE_TIMEOUT = 60.0
#: reconnection as presence.js does it: the first delay, doubled after each connection that
#: failed or did not last STABLE seconds, up to RETRY_MAX; at least RATE_LIMITED after a
#: 4429 or 4408 close, and the server's own hint after a 1013 ("try again later")
RETRY = 1.0
RETRY_MAX = 30.0
STABLE = 10.0
RATE_LIMITED = 10.0
SLOW_DOWN_CODES = ("4429", "4408")
#: how long a client waits for its handshake (a browser waits as long as TCP does; the load
#: test's daphne processes allow 30 s, tools/loadtest/servers.py)
OPEN_TIMEOUT = 30.0


async def open_socket(port: int, path: str, cookie: str) -> ClientConnection:
    """A socket to the server on ``port`` as a page opens it: its session cookie, its origin."""
    return await connect(
        f"ws://127.0.0.1:{port}{path}",
        additional_headers={"Cookie": f"sessionid={cookie}"},
        origin=f"http://127.0.0.1:{port}",  # type: ignore[arg-type]
        open_timeout=OPEN_TIMEOUT,
        ping_interval=None,
        close_timeout=5,
        compression=None,
        max_size=2**22,
    )


def retry_delay(attempts: int, code: str, draw: float) -> float:
    """presence.js's ``retryDelay``: exponential backoff with "equal jitter" (half the delay
    fixed, half random, ``draw`` in [0, 1)), so that the clients of a restarted server do not
    all come back in the same instant, nor again together after each refusal."""
    delay = min(RETRY_MAX, RETRY * 2 ** (max(1, attempts) - 1))
    jittered = delay / 2 + draw * delay / 2
    return max(RATE_LIMITED, jittered) if code in SLOW_DOWN_CODES else jittered


#: one presence as compared: status, last_seen, devices, text, emoji, activity
PresenceTuple = tuple[str, str | None, tuple[str, ...], str | None, str | None, str | None]


def as_tuple(presence: dict[str, Any]) -> PresenceTuple:
    return (
        presence.get("status", "offline"),
        presence.get("last_seen"),
        tuple(presence.get("devices") or ()),
        presence.get("text"),
        presence.get("emoji"),
        presence.get("activity"),
    )


def stamp_text(at: float) -> str:
    """A status text carrying the time its change was made (the fan-out's start)."""
    return f"t={at:.4f}"


def stamp_of(text: str | None) -> float | None:
    """The time a status text made by :func:`stamp_text` carries, or None (another text)."""
    if not text or not text.startswith("t="):
        return None
    try:
        return float(text[2:])
    except ValueError:
        return None


def reveals(presence: PresenceTuple) -> bool:
    """Whether a presence shows anything beyond "offline, never seen" (a hidden user's look)."""
    status, last_seen, devices, text, emoji, activity = presence
    return status != "offline" or bool(last_seen or devices or text or emoji or activity)


@dataclass
class ClientSpec:
    index: int
    user: int
    cookie: str
    page: list[int]
    device: str
    server: int
    #: rooms joined on opening (tools/loadtest/rooms.py)
    rooms: list[str] = field(default_factory=list)


@dataclass
class GeneratorSpec:
    number: int
    clients: list[ClientSpec]
    #: users with sessions who only view pages (online through the middleware)
    page_viewers: list[tuple[int, str]]
    ports: list[int]
    hidden: set[int]
    blocked_pairs: set[tuple[int, int]]
    heartbeat_interval: float
    churn_per_second: float
    status_per_second: float
    idle_per_second: float
    page_views_per_second: float
    seed: int


@dataclass
class Stats:
    frames_sent: int = 0
    frames_received: int = 0
    heartbeats: int = 0
    http_requests: int = 0
    http_5xx: list[tuple[float, int]] = field(default_factory=list)
    #: (time, code, client index) of closes and failures the client did not ask for
    unrequested: list[tuple[float, str, int]] = field(default_factory=list)
    leaks: list[tuple[float, int, int, PresenceTuple]] = field(default_factory=list)
    #: (when the change was made, its latency to this subscriber)
    latencies: list[tuple[float, float]] = field(default_factory=list)
    opened: int = 0
    reloads: int = 0
    tab_closes: int = 0
    status_changes: int = 0
    idle_switches: int = 0
    #: (time, what): client exceptions and error frames
    exceptions: list[tuple[float, str]] = field(default_factory=list)
    #: clients by state when the stats were asked for (ready, opening, waiting for a snapshot)
    states: dict[str, int] = field(default_factory=dict)
    #: snapshots (presence_state) by kind: "whole" (no stamp sent) and "resuming" (a stamp
    #: sent), and the users they carried: "users sent" and "users unchanged" (resuming only)
    snapshots: dict[str, int] = field(default_factory=dict)
    #: (time, how late a LAG_TICK sleep woke): this process's event loop behind, which every
    #: latency it measures carries too
    loop_lags: list[tuple[float, float]] = field(default_factory=list)
    #: (when a status change was made, when its own socket was told it was written)
    written: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class BareStorm:
    """One generator's part of the bare floor of a reconnect storm (Generator.bare_storm)."""

    #: clients that had their frame
    done: int = 0
    #: seconds until the last of them had it; None when some had not within the timeout
    seconds: float | None = 0.0
    #: failed attempts by kind (each tried again after a backoff)
    failures: dict[str, int] = field(default_factory=dict)


def count(failures: dict[str, int], kind: str) -> None:
    failures[kind] = failures.get(kind, 0) + 1


def attempts_after_drop(attempts: int, opened_at: float) -> int:
    """A reconnection's attempt, as presence.js counts it: a connection that lasted STABLE
    seconds (``opened_at``, 0: it never opened) starts the backoff over."""
    if opened_at and time.time() - opened_at >= STABLE:
        attempts = 0
    return attempts + 1


class BareHold:
    """The killed floor of a reconnect storm (Generator.bare_hold): clients each holding a
    socket to the bare consumer (``ws/bare/?hold=1``: accept, read the user, one frame, stay
    open) and, when it drops, reconnecting by themselves with presence.js's backoff, the
    attempts counted as ``Client.retry_later`` counts them."""

    def __init__(self, generator: Generator, port: int, clients: list[Client]) -> None:
        self.gen = generator
        self.port = port
        self.clients = clients
        #: the opening (seconds from bare_hold's call) and the return after the drop (seconds
        #: set by ``Generator.bare_again``, from the restarted process's answer)
        self.first = BareStorm()
        self.back = BareStorm()
        #: monotonic time each client (by index) had its frame again after its socket dropped
        self.again_at: dict[int, float] = {}
        self.last_opened = 0.0
        self.held = asyncio.Event()
        self.all_back = asyncio.Event()
        self.sockets: dict[int, ClientConnection] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.releasing = False
        self.started = time.monotonic()

    def start(self) -> None:
        self.tasks = [asyncio.ensure_future(self.hold(client)) for client in self.clients]
        if not self.clients:
            self.held.set()
            self.all_back.set()

    async def hold(self, client: Client) -> None:
        attempts = 0
        opened_at = 0.0
        # Once it had its frame, any later socket is a return after the drop (the kill).
        held = False
        while not (self.gen.stopping or self.releasing):
            phase = self.back if held else self.first
            try:
                async with self.gen.opening:
                    ws = await open_socket(self.port, "/ws/bare/?hold=1", client.spec.cookie)
            except Exception as error:  # refused, timed out: as presence.js, after a backoff
                failed = f"open:{type(error).__name__}"
                count(phase.failures, type(error).__name__)
                opened_at = 0.0
                attempts += 1
                await asyncio.sleep(retry_delay(attempts, failed, random.random()))
                continue
            opened_at = time.time()
            self.sockets[client.spec.index] = ws
            try:
                hello = json.loads(await asyncio.wait_for(ws.recv(), OPEN_TIMEOUT))
                if hello.get("user") != client.spec.user:
                    count(phase.failures, "unauthenticated")
                self.had_frame(client, again=held)
                held = True
                await ws.wait_closed()
            except Exception as error:  # closed or silent before its frame
                count(phase.failures, type(error).__name__)
                with contextlib.suppress(Exception):
                    await ws.close()
            self.sockets.pop(client.spec.index, None)
            if self.releasing:
                return
            # Its socket dropped: as Client.retry_later.
            attempts = attempts_after_drop(attempts, opened_at)
            code = str(ws.close_code if ws.close_code is not None else "none")
            await asyncio.sleep(retry_delay(attempts, code, random.random()))

    def had_frame(self, client: Client, again: bool) -> None:
        now = time.monotonic()
        if not again:
            self.first.done += 1
            self.first.seconds = now - self.started
            self.last_opened = time.time()
            if self.first.done == len(self.clients):
                self.held.set()
        elif client.spec.index not in self.again_at:
            self.again_at[client.spec.index] = now
            self.back.done += 1
            if self.back.done == len(self.clients):
                self.all_back.set()

    async def release(self) -> None:
        """Every socket closed, every client stopped (bounded)."""
        self.releasing = True
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        closing = [asyncio.ensure_future(ws.close()) for ws in self.sockets.values()]
        self.sockets.clear()
        if closing:
            await asyncio.wait(closing, timeout=30)


class Client:
    def __init__(self, spec: ClientSpec, generator: Generator) -> None:
        self.spec = spec
        self.gen = generator
        self.ws: ClientConnection | None = None
        self.view: dict[int, PresenceTuple] = {}
        self.stamps: dict[int, str | None] = {}
        #: targets whose diff arrived before their snapshot
        self.early: set[int] = set()
        #: the stamp of the page's last whole snapshot (the earliest of its answers' stamps),
        #: handed back on the next connection as presence.js does: only what changed since
        #: is sent (docs/websocket.md, "Resuming after a reconnect"); None before the first
        self.resume: str | None = None
        #: the stamps of this connection's answers so far
        self.answer_stamps: list[str] = []
        #: this connection's subscriptions were sent with a stamp (only changes are sent)
        self.resuming = False
        self.pending_snapshots = 0
        self.idle = False
        self.closing = False
        self.last_beat = 0.0
        #: when the heartbeat timer fires next (the first beat goes with the opening)
        self.next_beat = 0.0
        self.opened_at = 0.0
        self.task: asyncio.Task[None] | None = None
        self.room_views = RoomViews()
        #: connections in a row that failed or did not last STABLE seconds (presence.js)
        self.attempts = 0

    def retry_later(self, code: str) -> None:
        """Reopen after presence.js's backoff (a connection that lasted resets it)."""
        self.attempts = attempts_after_drop(self.attempts, self.opened_at)
        self.gen.reopen_later(self, retry_delay(self.attempts, code, random.random()))

    @property
    def ready(self) -> bool:
        return (
            self.ws is not None
            and not self.closing
            and self.pending_snapshots == 0
            and not self.room_views.pending
        )

    async def open(self) -> None:
        gen = self.gen
        port = gen.spec.ports[self.spec.server % len(gen.spec.ports)]
        page = self.spec.page
        chunks = [page[i : i + SUBSCRIBE_CHUNK] for i in range(0, len(page), SUBSCRIBE_CHUNK)]
        # As presence.js: the page's first users subscribed in the opening request, with the
        # stamp of what the client shows (none at first: the full snapshot, with a stamp), and
        # an idle client opening idle.
        since = self.resume or ""
        query = f"device={self.spec.device}" + ("&state=idle" if self.idle else "")
        if chunks:
            query += f"&users={','.join(map(str, chunks[0]))}&since={quote(since)}"
        path = f"/ws/presence/?{query}"
        self.closing = False
        # Kept: the users an answer lists as unchanged are shown as they were.
        self.stamps = {}
        self.early = set()
        self.answer_stamps = []
        self.resuming = bool(since)
        try:
            async with gen.opening:
                self.ws = await open_socket(port, path, self.spec.cookie)
        except Exception as error:  # refused, timed out: the server is down or overloaded
            self.ws = None
            failed = f"open:{type(error).__name__}"
            gen.stats.unrequested.append((time.time(), failed, self.spec.index))
            if not gen.stopping:
                self.opened_at = 0.0
                self.retry_later(failed)
            return
        self.opened_at = time.time()
        gen.stats.opened += 1
        self.pending_snapshots = len(chunks)
        self.task = asyncio.create_task(self.run(self.ws))
        for chunk in chunks[1:]:
            await self.send({"type": "subscribe", "users": chunk, "since": since or None})
        self.room_views.reset(self.spec.rooms)
        for room in self.spec.rooms:
            await self.send({"type": "join", "room": room, "meta": None})
        self.next_beat = time.time() + gen.spec.heartbeat_interval
        await self.beat()

    async def join_later(self, room: str, delay: float) -> None:
        ws = self.ws
        await asyncio.sleep(delay)
        if ws is not None and self.ws is ws and not self.closing and not self.gen.stopping:
            await self.send({"type": "join", "room": room, "meta": None})

    async def send(self, frame: dict[str, Any]) -> None:
        ws = self.ws
        if ws is None or self.closing:
            return
        try:
            await ws.send(json.dumps(frame))
            self.gen.stats.frames_sent += 1
        except ConnectionClosed:
            pass  # the reader reports the close

    async def beat(self) -> None:
        await self.send({"type": "heartbeat", "state": "idle" if self.idle else "active"})
        if self.ws is not None and not self.closing:
            self.last_beat = time.time()
            self.gen.stats.heartbeats += 1

    async def run(self, ws: ClientConnection) -> None:
        gen = self.gen
        try:
            async for message in ws:
                gen.stats.frames_received += 1
                self.receive(json.loads(message))
        except ConnectionClosed:
            pass
        except Exception as error:
            gen.stats.exceptions.append((time.time(), repr(error)))
        if not self.closing and self.ws is ws:
            code = ws.close_code if ws.close_code is not None else "none"
            gen.stats.unrequested.append((time.time(), str(code), self.spec.index))
            self.ws = None
            self.retry_later(str(code))

    def receive(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind in ("room_state", "room_diff"):
            spec = self.gen.spec
            for leaked in self.room_views.apply(
                frame, self.spec.user, spec.hidden, spec.blocked_pairs
            ):
                self.gen.stats.leaks.append((time.time(), self.spec.user, leaked, ("room",) * 6))  # type: ignore[arg-type]
            return
        if kind == "status":
            # The server's answer to this client's own set_status: the change written (its
            # write path alone, before any announcement), timed from the same stamp.
            stamp = stamp_of((frame.get("presence") or {}).get("text"))
            if stamp is not None:
                self.gen.stats.written.append((stamp, time.time() - stamp))
            return
        if kind == "stamp":
            # As presence.js: a fresh stamp covers everything answered before it (an answer
            # still on its way brings its own), and a reconnect resumes from it
            if isinstance(frame.get("stamp"), str) and not self.pending_snapshots:
                self.resume = frame["stamp"]
            return
        if kind not in ("presence_state", "presence_diff"):
            if kind == "error":
                self.gen.stats.exceptions.append((time.time(), f"error frame: {frame}"))
                if frame.get("code") == "unavailable" and frame.get("room") in self.spec.rooms:
                    # The room could not be read (Redis down or every pooled connection busy):
                    # joined again shortly, as the error asks; the view stays pending till then.
                    self.gen.spawn(self.join_later(str(frame["room"]), 1 + random.random()))
            return
        now = time.time()
        viewer = self.spec.user
        gen = self.gen
        for key, raw in frame["presences"].items():
            target = int(key)
            presence = as_tuple(raw)
            if (
                target != viewer
                and (target in gen.spec.hidden or (viewer, target) in gen.spec.blocked_pairs)
                and reveals(presence)
            ):
                gen.stats.leaks.append((now, viewer, target, presence))
            if kind == "presence_diff":
                text = presence[3]
                before = self.stamps.get(target)
                stamp = stamp_of(text)
                if stamp is not None and before is not None and before != text:
                    gen.stats.latencies.append((stamp, now - stamp))
            # The last stamp shown; None when the text is hidden (its next appearance is a
            # change of visibility, not of status: no sample).
            self.stamps[target] = presence[3]
            if kind == "presence_diff":
                if target not in self.view and self.pending_snapshots:
                    # A diff before the snapshot describes a later state: it wins.
                    self.early.add(target)
                self.view[target] = presence
            elif target not in self.early:
                self.view[target] = presence
        if kind == "presence_state":
            counts = gen.stats.snapshots
            if self.resuming:
                counts["resuming"] = counts.get("resuming", 0) + 1
                counts["users sent"] = counts.get("users sent", 0) + len(frame["presences"])
                unchanged = len(frame.get("unchanged") or ())
                counts["users unchanged"] = counts.get("users unchanged", 0) + unchanged
            else:
                counts["whole"] = counts.get("whole", 0) + 1
            if isinstance(frame.get("stamp"), str):
                self.answer_stamps.append(frame["stamp"])
            self.pending_snapshots = max(0, self.pending_snapshots - 1)
            if not self.pending_snapshots:
                self.early.clear()
                # Stamps are "<milliseconds>.<signature>": the earliest claims the least.
                stamps = sorted(self.answer_stamps, key=lambda stamp: int(stamp.split(".")[0]))
                self.resume = stamps[0] if stamps else None

    async def close(self) -> None:
        self.closing = True
        ws, self.ws = self.ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()
        if self.task is not None:
            with contextlib.suppress(Exception):
                await self.task
            self.task = None


class Generator:
    def __init__(self, spec: GeneratorSpec) -> None:
        self.spec = spec
        #: the plan's rates of status changes, idle switches and HTTP page views (set_rates)
        self.planned = (spec.status_per_second, spec.idle_per_second, spec.page_views_per_second)
        self.stats = Stats()
        self.rng = random.Random(spec.seed)
        self.clients = [Client(c, self) for c in spec.clients]
        self.opening = asyncio.Semaphore(OPENING_AT_ONCE)
        self.paused = False
        #: a paced opening's pace, a fraction of the planned one (the harness's, run.py)
        self.pace = 1.0
        self.stopping = False
        self.background: set[asyncio.Task[Any]] = set()
        #: the calibration's sockets (calibrate.py), open between its commands
        self.calibration: list[ClientConnection] = []
        #: the killed floor's clients (bare_hold), holding between its commands
        self.bare: BareHold | None = None

    def spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def reopen_later(self, client: Client, delay: float) -> None:
        async def reopen() -> None:
            await asyncio.sleep(delay)
            if not self.stopping and client.ws is None:
                await client.open()

        self.spawn(reopen())

    async def open_all(self, per_second: float | None = None) -> float:
        """Every client opens its socket: all at once (through the handshake limit), or
        ``per_second`` of them each second (the pace the machine carries, calibrate.py)."""
        started = time.monotonic()
        if not per_second:
            await asyncio.gather(*(client.open() for client in self.clients))
            return time.monotonic() - started
        opening = []
        next_at = started
        for client in self.clients:
            wait = next_at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            opening.append(asyncio.create_task(client.open()))
            # At the pace the harness sets as it goes (``pace``: a fraction of the planned
            # one); a late tick is not made up for by a burst.
            next_at = max(next_at, time.monotonic() - 1.0) + 1 / (per_second * self.pace)
        await asyncio.gather(*opening)
        return time.monotonic() - started

    async def settle(self, timeout: float) -> float:
        """Wait until every open client has received its snapshots, at most ``timeout``
        seconds; the seconds it took (after a storm of openings the servers need a while)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if all(client.ready or client.ws is None for client in self.clients):
                break
            await asyncio.sleep(TICK)
        return time.monotonic() - started

    async def heartbeats(self) -> None:
        """Each client beats every interval from its own last beat, as a browser's timer does:
        the beats of a page opened at some moment are not in step with everyone else's."""
        interval = self.spec.heartbeat_interval
        while not self.stopping:
            now = time.time()
            for client in self.clients:
                if client.ws is not None and not client.closing and now >= client.next_beat:
                    # On the timer's own pace (a tick late is not carried on), unless the
                    # client fell a whole interval behind.
                    client.next_beat = max(client.next_beat + interval, now)
                    self.spawn(client.beat())
            await asyncio.sleep(TICK)

    async def loop_lag(self) -> None:
        """How late this event loop wakes: a frame received meanwhile waited as long."""
        loop = asyncio.get_running_loop()
        while not self.stopping:
            asleep = loop.time()
            await asyncio.sleep(LAG_TICK)
            self.stats.loop_lags.append((time.time(), loop.time() - asleep - LAG_TICK))

    def set_rates(self, churn: float, scale: float) -> None:
        """Page views over sockets at ``churn`` per client per second; status changes, idle
        switches and HTTP page views at ``scale`` of the plan's rates."""
        spec, planned = self.spec, self.planned
        spec.churn_per_second = churn
        spec.status_per_second = planned[0] * scale
        spec.idle_per_second = planned[1] * scale
        spec.page_views_per_second = planned[2] * scale

    def draws(self, rate: float, count: int, seconds: float = TICK) -> int:
        """Events in one tick of ``seconds`` of ``count`` clients at ``rate`` per client per
        second."""
        expected = rate * count * seconds
        whole = int(expected)
        return whole + (1 if self.rng.random() < expected - whole else 0)

    async def behaviours(self) -> None:
        spec = self.spec
        last = time.monotonic()
        while not self.stopping:
            await asyncio.sleep(TICK)
            # The tick's own length: a busy event loop wakes late, and the rate holds anyway
            # (a stall of more than a second is not made up for by a burst).
            now = time.monotonic()
            tick, last = min(now - last, 1.0), now
            if self.paused:
                continue
            live = [c for c in self.clients if c.ready]
            if not live:
                continue
            for _ in range(self.draws(spec.churn_per_second, len(live), tick)):
                self.spawn(self.churn(self.rng.choice(live)))
            for _ in range(self.draws(spec.status_per_second, len(live), tick)):
                self.spawn(self.change_status(self.rng.choice(live)))
            for _ in range(self.draws(spec.idle_per_second, len(live), tick)):
                client = self.rng.choice(live)
                client.idle = not client.idle
                self.stats.idle_switches += 1
                self.spawn(client.beat())
            for _ in range(self.draws(spec.page_views_per_second, len(live), tick)):
                if spec.page_viewers and self.rng.random() < 0.5:
                    _user, cookie = self.rng.choice(spec.page_viewers)
                    page = self.rng.choice(live).spec.page
                else:
                    client = self.rng.choice(live)
                    cookie, page = client.spec.cookie, client.spec.page
                self.spawn(self.page_view(cookie, page))

    async def churn(self, client: Client) -> None:
        if client.closing or client.ws is None:
            return
        await client.close()
        if self.rng.random() < 0.5:
            self.stats.reloads += 1
            delay = 0.05
        else:
            self.stats.tab_closes += 1
            delay = 1 + 3 * self.rng.random()
        self.reopen_later(client, delay)

    async def reload(self, client: Client) -> None:
        await client.close()
        self.reopen_later(client, 0.05)

    async def change_status(self, client: Client) -> None:
        status = self.rng.choices(["auto", "dnd", "invisible"], [0.7, 0.25, 0.05])[0]
        self.stats.status_changes += 1
        await client.send({"type": "set_status", "status": status, "text": stamp_text(time.time())})

    async def page_view(self, cookie: str, page: list[int]) -> None:
        port = self.rng.choice(self.spec.ports)
        ids = ",".join(str(i) for i in page[:20])
        request = (
            f"GET /presence/api/presence?users={ids} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Cookie: sessionid={cookie}\r\nConnection: close\r\n\r\n"
        ).encode()
        self.stats.http_requests += 1
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port), timeout=10
            )
            writer.write(request)
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), timeout=30)
            await asyncio.wait_for(reader.read(), timeout=30)
            writer.close()
            status = int(status_line.split()[1]) if status_line else 599
        except (OSError, TimeoutError, ValueError, IndexError):
            status = 599  # no answer: counted like a 5xx
        if status >= 500:
            self.stats.http_5xx.append((time.time(), status))

    def views(self, indices: list[int] | None) -> list[tuple[int, int, dict[int, PresenceTuple]]]:
        chosen = self.clients if indices is None else [self.clients[i] for i in indices]
        return [(c.spec.index, c.spec.user, dict(c.view)) for c in chosen if c.ready]

    def room_views(self) -> list[RoomViewsOf]:
        return [
            (c.spec.index, c.spec.user, c.room_views.snapshot())
            for c in self.clients
            if c.ready and c.spec.rooms
        ]

    def states(self) -> dict[str, int]:
        counts = {"ready": 0, "closed": 0, "closing": 0, "awaiting snapshot": 0}
        for client in self.clients:
            if client.ready:
                counts["ready"] += 1
            elif client.ws is None:
                counts["closed"] += 1
            elif client.closing:
                counts["closing"] += 1
            elif client.pending_snapshots:
                counts["awaiting snapshot"] += 1
            else:
                counts["awaiting room_state"] = counts.get("awaiting room_state", 0) + 1
        return counts

    def beats(self) -> dict[int, float]:
        """The latest heartbeat each user sent on a connection open for more than one interval."""
        latest: dict[int, float] = {}
        settle = time.time() - self.spec.heartbeat_interval
        for client in self.clients:
            if client.ready and client.opened_at < settle and client.last_beat:
                latest[client.spec.user] = max(latest.get(client.spec.user, 0), client.last_beat)
        return latest

    async def bare_storm(self, port: int, positions: list[int], timeout: float) -> BareStorm:
        """The floor of a reconnect storm (``--storm``): the clients at ``positions`` open a
        socket at once to a bare Channels consumer behind ``AuthMiddlewareStack`` on ``port``
        (``benchmarks.page_views_asgi``: accept, read the user, one frame, close), each with
        its session cookie, through the same handshake limit and backoff as a reconnection.
        The seconds until every one had its frame, from this call."""
        started = time.monotonic()
        result = BareStorm()

        async def one(client: Client) -> None:
            attempts = 0
            while not self.stopping:
                try:
                    async with self.opening:
                        ws = await open_socket(port, "/ws/bare/", client.spec.cookie)
                    try:
                        hello = json.loads(await asyncio.wait_for(ws.recv(), OPEN_TIMEOUT))
                    finally:
                        await ws.close()
                except Exception as error:  # refused, timed out: tried again after a backoff
                    count(result.failures, type(error).__name__)
                    attempts += 1
                    await asyncio.sleep(retry_delay(attempts, "", random.random()))
                    continue
                if hello.get("user") != client.spec.user:
                    count(result.failures, "unauthenticated")
                result.done += 1
                result.seconds = time.monotonic() - started
                return

        tasks = [asyncio.ensure_future(one(self.clients[p])) for p in positions]
        _, late = await asyncio.wait(tasks, timeout=timeout)
        for task in late:
            task.cancel()
        if late:
            result.seconds = None
        return result

    async def bare_hold(self, port: int, positions: list[int], timeout: float) -> BareStorm:
        """The killed floor's opening (``--storm``): the clients at ``positions`` open a socket
        to the bare consumer on ``port`` that it holds open (``ws/bare/?hold=1``), through the
        same handshake limit and backoff, and keep it; answered once every one had its frame
        and has held it for STABLE seconds (a dropped socket then starts the backoff over, as a
        presence client's long-open one does), or after ``timeout`` (``seconds`` None). Each
        reconnects by itself when its socket drops (``bare_again`` times that)."""
        if self.bare is not None:
            await self.bare.release()
        hold = self.bare = BareHold(self, port, [self.clients[p] for p in positions])
        hold.start()
        try:
            await asyncio.wait_for(hold.held.wait(), timeout)
        except TimeoutError:
            hold.first.seconds = None
            return hold.first
        await asyncio.sleep(max(0.0, hold.last_opened + STABLE - time.time()))
        return hold.first

    async def bare_again(self, answered: float, timeout: float) -> BareStorm:
        """The killed floor's return: waits until every held client had its frame again after
        its socket dropped, at most until ``timeout`` seconds after ``answered`` (the
        restarted process's answer, ``time.monotonic()``: one clock for every process of this
        machine); the seconds from ``answered`` until the last one had it (None: not all)."""
        hold = self.bare
        if hold is None:
            return BareStorm(seconds=None)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                hold.all_back.wait(), max(0.0, answered + timeout - time.monotonic())
            )
        back = hold.back
        if back.done < len(hold.clients):
            back.seconds = None
        else:
            back.seconds = max(0.0, max(hold.again_at.values(), default=answered) - answered)
        return back

    async def bare_release(self) -> None:
        hold, self.bare = self.bare, None
        if hold is not None:
            await hold.release()

    async def calibration_open(self, port: int, positions: list[int]) -> tuple[int, int]:
        """The calibration (calibrate.py): the clients at ``positions`` open a presence socket
        of their own to ``port`` as they open their page (its users in the URL, their rooms
        joined, one heartbeat), through the same handshake limit; (opened, failed) once each
        has its snapshot or failed. Their frames are read and dropped."""
        sockets = self.calibration = []
        failed = 0

        async def one(client: Client) -> None:
            nonlocal failed
            page = client.spec.page[:SUBSCRIBE_CHUNK]
            path = (
                f"/ws/presence/?device={client.spec.device}&users={','.join(map(str, page))}&since="
            )
            try:
                async with self.opening:
                    ws = await open_socket(port, path, client.spec.cookie)
                for room in client.spec.rooms:
                    await ws.send(json.dumps({"type": "join", "room": room, "meta": None}))
                await ws.send(json.dumps({"type": "heartbeat", "state": "active"}))
                while (
                    json.loads(await asyncio.wait_for(ws.recv(), OPEN_TIMEOUT)).get("type")
                    != "presence_state"
                ):
                    pass
            except Exception:
                failed += 1
                return
            sockets.append(ws)
            self.spawn(self.drain(ws))

        await asyncio.gather(*(one(self.clients[p]) for p in positions))
        return len(sockets), failed

    @staticmethod
    async def drain(ws: ClientConnection) -> None:
        with contextlib.suppress(Exception):
            async for _message in ws:
                pass

    async def calibration_beats(self, beats: int, spacing: float) -> int:
        """Each calibration socket beats ``beats`` times, ``spacing`` seconds apart (from an
        offset of its own, so that the beats are spread); the heartbeats sent."""
        sent = 0

        async def one(ws: ClientConnection) -> None:
            nonlocal sent
            await asyncio.sleep(random.random() * spacing)
            for _ in range(beats):
                with contextlib.suppress(ConnectionClosed):
                    await ws.send('{"type": "heartbeat", "state": "active"}')
                    sent += 1
                await asyncio.sleep(spacing)

        await asyncio.gather(*(one(ws) for ws in self.calibration))
        return sent

    async def calibration_close(self) -> None:
        sockets, self.calibration = self.calibration, []
        closing = [asyncio.ensure_future(ws.close()) for ws in sockets]
        if closing:
            await asyncio.wait(closing, timeout=30)

    async def stop(self) -> None:
        """Every client leaves (a requested close); bounded, so that a stuck handshake or
        close cannot hold the run."""
        self.stopping = True
        await self.bare_release()
        for task in list(self.background):
            task.cancel()
        closing = [asyncio.ensure_future(client.close()) for client in self.clients]
        _, late = await asyncio.wait(closing, timeout=30)
        for task in late:
            task.cancel()
        if self.background:
            await asyncio.wait(list(self.background), timeout=5)


async def before_opening(generator: Generator, pipe: Connection) -> float | None:
    """Until the harness says ``open``: the calibration's commands (calibrate.py) before any
    client opens. ``open`` carries the heartbeat interval chosen and the opening's pace (per
    second for this generator, None: all at once); the pace is returned."""
    loop = asyncio.get_running_loop()
    while True:
        ready = await loop.run_in_executor(None, pipe.poll, 0.2)
        if not ready:
            continue
        command, argument = pipe.recv()
        if command == "open":
            interval, per_second = argument
            generator.spec.heartbeat_interval = float(interval)
            return float(per_second) if per_second else None
        if command in ("pause", "resume"):
            pipe.send(("ok", None))
        elif command == "bare_storm":
            pipe.send(("bare_storm", await generator.bare_storm(*argument)))
        elif command == "calibration_open":
            pipe.send(("calibration_open", await generator.calibration_open(*argument)))
        elif command == "calibration_beats":
            pipe.send(("calibration_beats", await generator.calibration_beats(*argument)))
        elif command == "calibration_close":
            await generator.calibration_close()
            pipe.send(("ok", None))
        elif command == "stop":
            pipe.send(("stats", generator.stats))
            raise EOFError


async def serve(spec: GeneratorSpec, pipe: Connection) -> None:
    generator = Generator(spec)
    loop = asyncio.get_running_loop()
    per_second = await before_opening(generator, pipe)
    # A paced opening's load waits for the harness's "resume" (the servers done with it).
    generator.paused = per_second is not None
    opening = True

    async def follow_pace() -> None:
        # The harness's ("pace", fraction) while the opening runs (run.py reads the servers'
        # CPU); the only reader of the pipe until "opened" is sent.
        while opening:
            if await loop.run_in_executor(None, pipe.poll, 0.2):
                command, argument = pipe.recv()
                if command == "pace":
                    generator.pace = float(argument)

    pacing = asyncio.create_task(follow_pace())
    # Beating from the first socket on: a paced opening lasts minutes, and a socket silent
    # for CONNECTION_TTL meanwhile expired, its user offline and back (announced to every
    # watcher, stamped: a resume later was sent nearly everyone again).
    tasks = [asyncio.create_task(generator.heartbeats()), asyncio.create_task(generator.loop_lag())]
    opened_in = await generator.open_all(per_second)
    # The load starts once the opening storm has passed: every client has its snapshots.
    settled_in = await generator.settle(OPENING_SETTLE_TIMEOUT)
    opening = False
    await pacing
    pipe.send(("opened", (opened_in, settled_in)))
    tasks.append(asyncio.create_task(generator.behaviours()))
    try:
        while True:
            ready = await loop.run_in_executor(None, pipe.poll, 0.2)
            if not ready:
                continue
            command, argument = pipe.recv()
            if command == "pace":
                continue  # sent as the opening ended: nothing left to pace
            # Both answer the sockets opened so far: the harness counts the page views made
            # while the behaviours ran (tools/loadtest/clock.py).
            if command == "pause":
                generator.paused = True
                pipe.send(("ok", generator.stats.opened))
            elif command == "resume":
                generator.paused = False
                pipe.send(("ok", generator.stats.opened))
            elif command == "rate":
                # The page views over sockets (reloads and tab closes) per client per second,
                # and the share of the plan the other behaviours run at.
                churn, scale = argument
                generator.set_rates(float(churn), float(scale))
                pipe.send(("ok", None))
            elif command == "views":
                pipe.send(("views", generator.views(argument)))
            elif command == "reload":
                # Clients whose views never converged after a fault reload their page, as a
                # user would, so that the next fault is measured on its own.
                for position in argument:
                    generator.spawn(generator.reload(generator.clients[position]))
                pipe.send(("ok", None))
            elif command == "room_views":
                pipe.send(("room_views", generator.room_views()))
            elif command == "beats":
                pipe.send(("beats", generator.beats()))
            elif command == "bare_storm":
                pipe.send(("bare_storm", await generator.bare_storm(*argument)))
            elif command == "bare_hold":
                pipe.send(("bare_hold", await generator.bare_hold(*argument)))
            elif command == "bare_again":
                pipe.send(("bare_again", await generator.bare_again(*argument)))
            elif command == "bare_release":
                await generator.bare_release()
                pipe.send(("ok", None))
            elif command == "stats":
                generator.stats.states = generator.states()
                pipe.send(("stats", generator.stats))
            elif command == "stop":
                await generator.stop()
                pipe.send(("stats", generator.stats))
                return
    finally:
        generator.stopping = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main(spec: GeneratorSpec, pipe: Connection) -> None:
    """A generator process's entry point (multiprocessing, spawn)."""
    with contextlib.suppress(EOFError, KeyboardInterrupt, BrokenPipeError):
        asyncio.run(serve(spec, pipe))
