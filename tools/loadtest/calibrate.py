"""What this machine carries: bare Channels' cost, ours measured briefly, and the pace of the
whole mix (``--rate auto``, the default at full size; ``--heartbeat N`` and ``--rate N`` given
explicitly override what they name).

Before any client opens, a daphne process of its own serves both Channels' minimum and presence
(the page-view benchmark's application, ``benchmarks.page_views_asgi``, on the load test's
settings), and SAMPLE of the clients, through the same handshake limit as a page view:

1. open a socket at once to a bare Channels consumer behind ``AuthMiddlewareStack`` (accept,
   read the user, one frame, close): the process's CPU per socket is what a page view's socket
   costs Channels and daphne themselves here ("bare");
2. open a presence socket each, as they open their page (its users in the URL, their rooms
   joined): the process's CPU per opening, until every snapshot is in and the announcements
   are done, is what opening a page costs presence here ("ours per opening");
3. beat BEATS times each, BEAT_SPACING apart (every beat written, as at any pace where a
   connection beats once per interval): the process's CPU per heartbeat, its idle CPU
   subtracted ("ours per heartbeat").

The plan (:func:`plan`) spends at most a share of the machine's cores on each part of the mix,
in the servers: HEARTBEAT_SHARE on heartbeats (the heartbeat interval, hence CONNECTION_TTL and
the convergence bound), PAGE_VIEW_SHARE on page views over sockets (reloads and tab closes),
each at ours' measured cost or PLANNED_RATIO times bare's, whichever is higher, and
OPENING_SHARE on the opening (the sockets opened at a pace instead of all at once). The rest of
the machine is the generators', Redis's and the harness's on one host, and the deployment
sizing keeps processes at half load for bursts and storms. At the end, the servers' CPU per page
view during the load (all of their work, heartbeats, diffs and rooms included) is set beside
bare's.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from tools.loadtest.harness import Generators

#: clients the calibration uses at most (each part)
SAMPLE = 1000
#: how long a part of the calibration may take before it is given up
TIMEOUT = 120.0
#: the machine's cores the servers may spend on each part of the mix
HEARTBEAT_SHARE = 0.15
PAGE_VIEW_SHARE = 0.25
OPENING_SHARE = 0.4
#: what a page view is planned to cost at least, in bare's (the page-view goal: at most twice)
PLANNED_RATIO = 2.0
#: the highest page-view rate "auto" picks, per second per connection (the default mix's)
MAX_CHURN = 0.02
#: the heartbeat intervals "auto" picks from (seconds; CONNECTION_TTL is three of them)
MIN_HEARTBEAT = 2
MAX_HEARTBEAT = 30
#: the calibration's heartbeats: each socket beats this many times, this far apart (past half
#: of its HEARTBEAT_INTERVAL, 2 s: every beat is written, as in the run)
BEATS = 4
BEAT_SPACING = 1.2
#: clients opening presence sockets in the calibration (at once, as a reconnect storm)
OURS_SAMPLE = 500
#: the calibration process has done its work once it uses at most QUIET cores over a window
QUIET = 0.05
QUIET_WINDOW = 0.5
QUIET_TIMEOUT = 30.0
#: the calibration process's CONNECTION_TTL (seconds): longer than the calibration
HOLD = 300
#: the opening takes at most this long (seconds): past it, faster than the share allows. Long:
#: the pace follows what an opening measured costs (a floor of 180 s asked 1.6 of 2 shared cores
#: at the full size, and that opening never ended); this only bounds a machine far too busy
MAX_OPENING = 1800.0
#: after a paced opening the load starts once the servers use at most this many times their
#: heartbeats' cores (plus QUIET each), over windows of CAUGHT_UP_WINDOW s, at most
#: CAUGHT_UP_TIMEOUT s: the opening's announcements are not measured as the load's fan-out
CAUGHT_UP_MARGIN = 1.5
#: while a paced opening runs, the servers' CPU is read every PACE_WINDOW s and the pace follows
#: it (next_pace): an opening costs more with every socket open already (each open is
#: announced to the watchers there), which the calibration's 500 sockets do not show; the pace
#: falls to MIN_PACE of the planned one at most
PACE_WINDOW = 2.0
MIN_PACE = 0.25
CAUGHT_UP_WINDOW = 2.0
CAUGHT_UP_TIMEOUT = 120.0


@dataclass
class Bare:
    clients: int = 0
    #: the bare process's CPU seconds for them, and the seconds until all had their frame
    cpu: float = 0.0
    seconds: float | None = None
    note: str = ""

    @property
    def per_page_view(self) -> float | None:
        return self.cpu / self.clients if self.clients and not self.note else None

    def row(self) -> str:
        if self.per_page_view is None:
            return f"not measured ({self.note or 'no clients'})"
        return (
            f"{self.per_page_view * 1000:.2f} ms of server CPU per page view ({self.clients:,} "
            f"sockets opened at once to a bare Channels consumer behind AuthMiddlewareStack, all "
            f"answered in {self.seconds or 0:.1f} s)"
        )


@dataclass
class Ours:
    """Presence's own costs in the calibration process (the module's doc, 2 and 3)."""

    opened: int = 0
    opening_cpu: float = 0.0
    beats: int = 0
    beat_cpu: float = 0.0
    note: str = ""
    #: the calibration process's channels ("specific.<process>"), as its hub logged them: its
    #: channel-layer group memberships are the run's to remove (forget_memberships), not orphans
    channels: set[str] = field(default_factory=set)

    @property
    def per_opening(self) -> float | None:
        return self.opening_cpu / self.opened if self.opened and not self.note else None

    @property
    def per_beat(self) -> float | None:
        return self.beat_cpu / self.beats if self.beats and not self.note else None

    def row(self) -> str:
        if self.per_opening is None or self.per_beat is None:
            return f"not measured ({self.note or 'no clients'})"
        return (
            f"{self.per_opening * 1000:.2f} ms per opening ({self.opened:,} pages opened at "
            f"once), {self.per_beat * 1000:.3f} ms per heartbeat ({self.beats:,} written)"
        )


@dataclass
class Plan:
    """The pace of the mix: the heartbeat interval, page views over sockets per second across
    all connections, sockets opened per second (None: all at once), and why."""

    heartbeat: int
    rate: float
    opening: float | None
    why: list[str] = field(default_factory=list)
    #: the servers' cores for the heartbeats at that pace (ours measured), if known
    heartbeat_cores: float | None = None
    #: the servers' cores the opening may use (its share, and the heartbeats'), if paced
    opening_cores: float | None = None

    def caught_up_below(self, processes: int) -> float | None:
        """The servers' CPU (cores) under which they are done with the opening: the
        heartbeats' and a little more per process (their sweeps), or None: no waiting."""
        if self.opening is None or self.heartbeat_cores is None:
            return None
        return CAUGHT_UP_MARGIN * self.heartbeat_cores + QUIET * processes


def next_pace(factor: float, cores: float, budget: float, late: bool) -> float:
    """The opening's pace, as a fraction of the planned one, after a window in which the
    servers used ``cores`` of their ``budget``: halved while one is behind its channel, cut to
    the budget when over it, raised by a quarter when well under (never above the plan)."""
    if late:
        return max(MIN_PACE, factor / 2)
    if cores > budget:
        return max(MIN_PACE, factor * budget / cores)
    if cores < 0.8 * budget:
        return min(1.0, factor * 1.25)
    return factor


def behind(log: Path) -> bool:
    """Whether a server's log says it is behind its channel (presence's warning, not followed
    by its "caught up")."""
    state = False
    for line in log.read_text(errors="replace").splitlines():
        if "behind its channel" in line:
            state = True
        elif "caught up with its channel" in line:
            state = False
    return state


def wait_caught_up(
    servers: list[tuple[int | None, Path]], below: float, timeout: float
) -> tuple[float, float, int]:
    """After a paced opening, until the servers' CPU over a window falls under ``below``
    cores and none says it is behind its channel (the opening's announcements done; on a
    starved machine the CPU alone falls), at most ``timeout`` seconds: (the seconds it took,
    their cores over the last window, the processes still behind)."""
    from tools.loadtest.storm import cpu_seconds

    started = time.monotonic()
    before = sum(cpu_seconds(pid) for pid, _log in servers)
    while True:
        time.sleep(CAUGHT_UP_WINDOW)
        now = sum(cpu_seconds(pid) for pid, _log in servers)
        cores = (now - before) / CAUGHT_UP_WINDOW
        late = sum(1 for _pid, log in servers if behind(log))
        waited = time.monotonic() - started
        if (cores <= below and not late) or waited > timeout:
            return waited, cores, late
        before = now


def measure(
    generators: Generators,
    positions: dict[int, tuple[int, int]],
    processes: int,
    env: dict[str, str],
    log_dir: Path,
) -> tuple[Bare, Ours]:
    """Bare Channels' CPU per page view and ours per opening and per heartbeat, before any
    client opens (the module's doc)."""
    from tools.loadtest.servers import BARE, DaphneProcess
    from tools.loadtest.storm import cpu_seconds

    chosen: dict[int, list[int]] = {}
    for index in sorted(positions)[:SAMPLE]:
        number, position = positions[index]
        chosen.setdefault(number, []).append(position)
    clients = sum(len(p) for p in chosen.values())
    bare, ours = Bare(clients=clients), Ours()
    # Its sockets stay recorded through the waits for quiet (no expiry's offline announcements
    # counted as an opening's or a heartbeat's cost); a beat is written as often as in the run.
    timing = {**json.loads(env.get("LOADTEST_PRESENCE") or "{}"), "CONNECTION_TTL": HOLD}
    own_env = {**env, "LOADTEST_PRESENCE": json.dumps(timing)}
    daphne = DaphneProcess(processes, own_env, log_dir, BARE, "calibration")
    try:
        daphne.start()
        daphne.wait_ready()
        time.sleep(0.5)  # its start-up's CPU settles
        start = cpu_seconds(daphne.pid)
        parts = generators.bare_storm(daphne.port, chosen, TIMEOUT)
        bare.cpu = cpu_seconds(daphne.pid) - start
        seconds = [part.seconds for part in parts]
        bare.seconds = None if None in seconds else max(s or 0.0 for s in seconds)
        if bare.seconds is None:
            bare.note = f"not all answered within {TIMEOUT:.0f} s"

        ours_chosen = {number: p[: OURS_SAMPLE // len(chosen)] for number, p in chosen.items()}
        start = cpu_seconds(daphne.pid)
        for number, pipe in enumerate(generators.pipes):
            pipe.send(("calibration_open", (daphne.port, ours_chosen.get(number, []))))
        answers = [pipe.recv()[1] for pipe in generators.pipes if pipe.poll(TIMEOUT)]
        if len(answers) < len(generators.pipes):
            raise RuntimeError(f"the calibration's sockets did not open within {TIMEOUT:.0f} s")
        ours.opened = sum(opened for opened, _failed in answers)
        failed = sum(failed for _opened, failed in answers)
        # The opening's work goes on after the snapshots (its announcements): until it is done.
        quiet, idle_rate = wait_quiet(daphne.pid)
        ours.opening_cpu = quiet - start
        if failed:
            ours.note = f"{failed} of {ours.opened + failed} sockets did not open"

        start, started = cpu_seconds(daphne.pid), time.monotonic()
        ours.beats = sum(generators.ask("calibration_beats", (BEATS, BEAT_SPACING)))
        end, _rate = wait_quiet(daphne.pid)
        elapsed = time.monotonic() - started
        ours.beat_cpu = max(0.0, end - start - idle_rate * elapsed)
        generators.ask("calibration_close")
        wait_quiet(daphne.pid)  # the sockets' closes handled (their groups left)
    except RuntimeError as error:
        bare.note = bare.note or str(error)
        ours.note = ours.note or str(error)
    finally:
        ours.channels = channels_of(daphne.log_path.read_text(errors="replace"))
        daphne.stop()
    return bare, ours


def channels_of(log: str) -> set[str]:
    """The processes a daphne's hubs listened for ("specific.<process>", of a channel
    "specific.<process>.hub<id>" or "specific.<process>!<id>"), from its log."""
    return set(re.findall(r"listens on channel (specific\.[0-9a-f]+)[!.]", log))


def process_of(channel: str) -> str:
    """The process part of a channel ("specific.<process>"; any other channel: itself)."""
    found = re.match(r"specific\.[0-9a-f]+(?=[!.])", channel)
    return found.group(0) if found else channel


def forget_memberships(layer_urls: list[str], channels: set[str]) -> int:
    """Remove the group memberships of these process channels from the layer's servers (a
    stopped calibration process's: what a SIGTERM cut short of its closes would otherwise
    count as the run's orphan groups). The number removed."""
    import redis

    removed = 0
    if not channels:
        return removed
    for url in layer_urls:
        client = redis.Redis.from_url(url)
        try:
            for key in client.scan_iter(match="asgi:group:*", count=1000):
                members = [m.decode() for m in client.zrange(key, 0, -1)]
                theirs = [m for m in members if process_of(m) in channels]
                if theirs:
                    removed += int(client.zrem(key, *theirs))
        finally:
            client.close()
    return removed


def wait_quiet(pid: int | None) -> tuple[float, float]:
    """Until the process's CPU falls to QUIET (its work done), at most QUIET_TIMEOUT seconds:
    its CPU seconds then, and the rate of its last window (cores)."""
    from tools.loadtest.storm import cpu_seconds

    deadline = time.monotonic() + QUIET_TIMEOUT
    before = cpu_seconds(pid)
    while True:
        time.sleep(QUIET_WINDOW)
        now = cpu_seconds(pid)
        rate = (now - before) / QUIET_WINDOW
        if rate <= QUIET or time.monotonic() > deadline:
            return now, rate
        before = now


def available_cores(seconds: float = 2.0) -> float:
    """The machine's cores not busy with other work now (other test suites on a shared
    machine), measured over ``seconds`` before the run starts anything busy; at least a
    quarter of them."""
    cores = psutil.cpu_count() or 1
    busy = psutil.cpu_percent(interval=seconds) / 100
    return cores * max(0.25, 1.0 - busy)


def plan(
    bare: Bare | None,
    ours: Ours | None,
    connections: int,
    default_heartbeat: int,
    default_rate: float,
    heartbeat: int | None = None,
    rate: float | None = None,
    cores: float | None = None,
) -> Plan:
    """The pace of the whole mix on ``cores`` (the module's doc); ``heartbeat`` and ``rate``
    given are kept as they are. Without a measure, the defaults, the sockets opened at once."""
    cores = cores or psutil.cpu_count() or 1
    why: list[str] = []
    on = f"{cores:.1f} cores"
    per_view = None
    if bare is not None and bare.per_page_view:
        per_view = PLANNED_RATIO * bare.per_page_view
        basis = f"{PLANNED_RATIO:.0f} x bare's {bare.per_page_view * 1000:.2f} ms"
        if ours is not None and ours.per_opening and ours.per_opening > per_view:
            per_view = ours.per_opening
            basis = f"ours {ours.per_opening * 1000:.2f} ms, above {basis}"
    if rate is not None:
        why.append(f"page views {rate:.1f}/s (--rate)")
    elif per_view is None:
        rate = default_rate
        why.append(f"page views {rate:.1f}/s (the mix's own: nothing measured)")
    else:
        carried = PAGE_VIEW_SHARE * cores / per_view
        rate = min(carried, MAX_CHURN * connections)
        capped = " (at most one per connection every 50 s)" if rate < carried else ""
        why.append(
            f"page views {rate:.1f}/s: {PAGE_VIEW_SHARE:.0%} of {on} at {basis} each{capped}"
        )
    per_beat = ours.per_beat if ours is not None else None
    if heartbeat is not None:
        why.append(f"heartbeat every {heartbeat} s (--heartbeat)")
    elif not per_beat:
        heartbeat = default_heartbeat
        why.append(f"heartbeat every {heartbeat} s (the default: nothing measured)")
    else:
        needed = connections * per_beat / (HEARTBEAT_SHARE * cores)
        heartbeat = min(MAX_HEARTBEAT, max(MIN_HEARTBEAT, math.ceil(needed)))
        why.append(
            f"heartbeat every {heartbeat} s: {connections:,} sockets at ours "
            f"{per_beat * 1000:.3f} ms each within {HEARTBEAT_SHARE:.0%} of {on} "
            f"(CONNECTION_TTL {3 * heartbeat} s)"
        )
    opening = None
    if ours is not None and ours.per_opening:
        carried = OPENING_SHARE * cores / ours.per_opening
        opening = max(carried, connections / MAX_OPENING)
        capped = f", at least {connections:,} in {MAX_OPENING:.0f} s" if opening > carried else ""
        why.append(
            f"sockets opened {opening:.0f}/s: {OPENING_SHARE:.0%} of {on} at ours "
            f"{ours.per_opening * 1000:.2f} ms each{capped} ({connections / opening:.0f} s for "
            f"{connections:,})"
        )
    else:
        why.append("sockets opened all at once (through the handshake limit)")
    heartbeat_cores = connections / heartbeat * per_beat if per_beat else None
    opening_cores = (OPENING_SHARE + HEARTBEAT_SHARE) * cores if opening is not None else None
    return Plan(heartbeat, rate, opening, why, heartbeat_cores, opening_cores)


def cpu_row(server_cpu: float, page_views: int, bare: Bare | None) -> str:
    """The servers' CPU per page view while the behaviours ran (checks and pauses left out),
    beside bare's."""
    if not page_views:
        return "no page views while the behaviours ran"
    ours = server_cpu / page_views
    text = (
        f"ours {ours * 1000:.2f} ms ({server_cpu:.1f} s over {page_views:,} page views while the "
        "behaviours ran, all of the servers' work then counted: heartbeats, diffs, rooms; checks "
        "and pauses left out)"
    )
    if bare is not None and bare.per_page_view:
        text += (
            f"; bare Channels {bare.per_page_view * 1000:.2f} ms: ratio "
            f"{ours / bare.per_page_view:.1f}"
        )
    return text
