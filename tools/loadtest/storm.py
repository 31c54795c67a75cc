"""The reconnect storm (``--storm``): every client of one server process reconnecting at once.

The process is killed (SIGKILL) and started again on its port; its clients see their socket
drop and reconnect by themselves, as ``presence.js`` does. Measured: the seconds from the
restarted process answering until every one of its clients is open again with a view that
agrees with the oracle. The behaviours are paused meanwhile, so what every view should show is
computed once before the kill, and read again only for the views that differ from it (the
harness's own ``bulk_presence`` calls are mostly not counted in the storm's time); a fresh
oracle check of every view at the end confirms it.

Then two floors, side by side in the same run, both a bare Channels consumer behind
``AuthMiddlewareStack`` in a daphne process of its own (the page-view benchmark's,
``benchmarks.page_views_asgi``: accept, read the user, one frame):

- at once: the same clients open a socket at once (it closes after its frame), through the same
  handshake limit and backoff; no storm, no backoff carried from refusals;
- after a kill: the same clients hold a socket to it (``ws/bare/?hold=1``), then it is killed
  and restarted on its port as ours was (``Faults.kill_daphne``), and timed from its answer until
  every client, back through the same backoff (with the attempts refused meanwhile), had its
  frame again: the same storm, Channels' own. The goal's ratio is ours over this one.

What the storm costs beyond that is presence's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tools.loadtest import oracle
from tools.loadtest.faults import Faults, LoadRun
from tools.loadtest.generator import BareStorm, PresenceTuple
from tools.loadtest.harness import expected_views
from tools.loadtest.servers import START_TIMEOUT
from tools.loadtest.windows import Window

#: how often the harness looks at the clients' views during the storm
POLL = 0.25
#: the storm's time is measured up to this; past it, the views still wrong are counted
STORM_TIMEOUT = 120.0


@dataclass
class Storm:
    clients: int = 0
    #: seconds from the kill until the restarted process answered HTTP
    restart: float = 0.0
    #: seconds from the process answering until every client was open again
    reopened_in: float | None = None
    #: ... and until every view agreed with the oracle as well (the storm's figure)
    right_in: float | None = None
    #: views still wrong at STORM_TIMEOUT, or at the fresh check afterwards
    wrong: int = 0
    #: CPU seconds the restarted process used until every view was right
    server_cpu: float = 0.0
    #: what went wrong with the restart itself, if anything
    note: str = ""
    #: at the last look: clients open with their snapshots, views differing, an example
    last_ready: int = 0
    last_differing: int = 0
    example: object = None
    #: clients open with their snapshots, by whole seconds after the process answered (the
    #: storm's shape: how fast they came back, not only when the last did)
    timeline: list[tuple[int, int]] = field(default_factory=list)
    #: the floor at once: seconds until every client had the bare consumer's frame (None: not
    #: within STORM_TIMEOUT), that process's CPU seconds meanwhile, failed attempts by kind
    bare_in: float | None = None
    bare_cpu: float = 0.0
    bare_failures: dict[str, int] = field(default_factory=dict)
    #: the floor at once was not measured (and why)
    bare_note: str = ""
    #: the floor after a kill: seconds from the restarted bare process answering until every
    #: client had its frame again (None: not within STORM_TIMEOUT), seconds from its kill
    #: until it answered, its CPU seconds from the answer, failed reconnections by kind
    killed_in: float | None = None
    killed_restart: float = 0.0
    killed_cpu: float = 0.0
    killed_failures: dict[str, int] = field(default_factory=dict)
    #: the floor after a kill was not measured (and why)
    killed_note: str = ""

    def cpu_per_client(self) -> float:
        """The restarted process's CPU seconds per client until every view was right: what a
        storm costs whatever else the machine was doing (its wall time depends on that)."""
        return self.server_cpu / self.clients if self.clients else 0.0

    def ratio(self) -> float | None:
        """The storm's time over the floor's after the same kill and restart: how many times
        Channels' own the same storm takes (the goal's ratio)."""
        return self._over(self.killed_in, self.killed_note)

    def at_once_ratio(self) -> float | None:
        """The storm's time over the floor's at once (no kill, no backoff carried)."""
        return self._over(self.bare_in, self.bare_note)

    def _over(self, floor: float | None, note: str) -> float | None:
        if self.right_in is None or not floor or note:
            return None
        return self.right_in / floor

    def floor_row(self) -> str:
        """Both floors of the bare consumer beside ours, and both ratios."""
        per_client = max(1, self.clients)
        if self.bare_note:
            at_once = f"at once not measured ({self.bare_note})"
        elif self.bare_in is None:
            at_once = f"not all had their frame within {STORM_TIMEOUT:.0f} s at once"
        else:
            at_once = f"all {self.clients:,} had their frame in {self.bare_in:.1f} s at once"
        if not self.bare_note:
            at_once += (
                f" (its CPU {self.bare_cpu:.1f} s, {self.bare_cpu / per_client * 1000:.1f} ms "
                f"per client; failed attempts: {_failures(self.bare_failures)})"
            )
        if self.killed_note:
            killed = f"after the same kill and restart not measured ({self.killed_note})"
        else:
            killed = (
                f"after the same kill and restart in {self.killed_in:.1f} s"
                if self.killed_in is not None
                else f"after the same kill and restart not all within {STORM_TIMEOUT:.0f} s"
            ) + (
                f" (its restart {self.killed_restart:.1f} s; its CPU {self.killed_cpu:.1f} s, "
                f"{self.killed_cpu / per_client * 1000:.1f} ms per client; failed "
                f"reconnections: {_failures(self.killed_failures)})"
            )
        ratios = [
            self._ratio_text(self.bare_in, self.bare_note, "at once"),
            self._ratio_text(self.killed_in, self.killed_note, "after a kill"),
        ]
        ours = (
            f"ours {self.right_in:.1f} s"
            if self.right_in is not None
            else f"ours not all right within {STORM_TIMEOUT:.0f} s"
        )
        return (
            f"a bare Channels consumer behind AuthMiddlewareStack: {at_once}; {killed}; "
            f"{ours}: ratio {', '.join(ratios)}"
        )

    def _ratio_text(self, floor: float | None, note: str, label: str) -> str:
        if note:
            return f"none {label}"
        if floor is None:
            # The floor not done within the timeout: ours is at most that many times it.
            if self.right_in is None:
                return f"none {label}"
            return f"below {self.right_in / STORM_TIMEOUT:.1f} {label}"
        if self.right_in is None:
            # Ours not all right within the timeout: the ratio is at least the timeout's.
            return f"above {STORM_TIMEOUT / floor:.1f} {label}" if floor else f"none {label}"
        return f"{self.right_in / floor:.1f} {label}" if floor else f"none {label}"

    def row(self) -> str:
        if self.right_in is None:
            return (
                f"{self.clients:,} clients of one process: not all right after "
                f"{STORM_TIMEOUT:.0f} s{self.note} ({self.last_ready} open, {self.last_differing} "
                f"differing from the views before, e.g. {self.example}); {self.wrong} wrong "
                f"at the fresh check; its CPU meanwhile {self.server_cpu:.1f} s, "
                f"{self.cpu_per_client() * 1000:.1f} ms per client"
            )
        return (
            f"{self.clients:,} clients of one process reconnected; every view right "
            f"{self.right_in:.1f} s after it answered again (all open after "
            f"{self.reopened_in or 0:.1f} s; restart {self.restart:.1f} s; its CPU "
            f"{self.server_cpu:.1f} s, {self.cpu_per_client() * 1000:.1f} ms per client); "
            f"{self.wrong} wrong at the fresh check{self.note}"
        )

    def timeline_row(self) -> str:
        """Clients open again, every few seconds after the process answered."""
        step = max(1, len(self.timeline) // 8)
        shown = [*self.timeline[::step], *self.timeline[-1:]]
        marks = dict(shown)
        return ", ".join(f"{second} s {ready:,}" for second, ready in sorted(marks.items()))


def _failures(failures: dict[str, int]) -> str:
    return ", ".join(f"{count:,} {kind}" for kind, count in sorted(failures.items())) or "none"


def _by_generator(run: LoadRun, indices: list[int]) -> dict[int, list[int]]:
    grouped: dict[int, list[int]] = {}
    for index in indices:
        number, position = run.oracle.positions[index]
        grouped.setdefault(number, []).append(position)
    return grouped


def cpu_seconds(pid: int | None) -> float:
    import psutil

    try:
        times = psutil.Process(pid).cpu_times() if pid else None
    except psutil.Error:
        return 0.0
    return 0.0 if times is None else times.user + times.system


def run_storm(run: LoadRun, faults: Faults) -> Storm:
    """Kill the first server, start it again (``Faults.kill_daphne``), and time its clients'
    return (behaviours paused for the whole storm; its closes excused inside its window)."""
    server = 0
    indices = sorted(i for i in run.oracle.positions if i % run.sizes.processes == server)
    chosen = _by_generator(run, indices)
    storm = Storm(clients=len(indices))
    run.pause_behaviours()
    try:
        time.sleep(1.0)  # the last changes arrive
        viewers = {viewer for _, viewer, _ in run.generators.views(chosen)}
        expected = expected_views(run.oracle.pages, viewers)
        daphne = run.servers.daphnes[server]
        window = Window("reconnect storm", time.time())
        run.windows.append(window)
        killed_at = time.monotonic()
        try:
            faults.kill_daphne()
        except RuntimeError as error:
            # Its clients' handshakes can keep even its HTTP probe waiting: measured on.
            storm.note = f" ({error} within {START_TIMEOUT:.0f} s of its restart)"
            faults.restarted.add(server)
        answered = time.monotonic()
        storm.restart = answered - killed_at
        cpu_start = cpu_seconds(daphne.pid)
        while time.monotonic() - answered < STORM_TIMEOUT:
            time.sleep(POLL)
            views = run.generators.views(chosen)
            storm.last_ready = len(views)
            second = int(time.monotonic() - answered)
            if not storm.timeline or storm.timeline[-1][0] < second:
                storm.timeline.append((second, len(views)))
            if len(views) < len(indices):
                continue
            if storm.reopened_in is None:
                storm.reopened_in = time.monotonic() - answered
            missing = {viewer for _, viewer, _ in views} - expected.keys()
            expected.update(expected_views(run.oracle.pages, missing))
            compared = _compare(run, views, expected)
            if compared.wrong:
                # What a view should show may have changed since (a tab closed before the
                # storm reopening): the differing viewers' truth is read again.
                wrong = set(compared.wrong)
                differing = [view for view in views if view[0] in wrong]
                expected.update(expected_views(run.oracle.pages, {v[1] for v in differing}))
                compared = _compare(run, differing, expected)
            storm.last_differing = len(compared.wrong)
            storm.example = compared.examples[:1]
            if not compared.wrong:
                storm.right_in = time.monotonic() - answered
                break
        storm.server_cpu = cpu_seconds(daphne.pid) - cpu_start
        window.end = time.time()
        window.converged_in = storm.right_in
        check = run.oracle.check(None)
        storm.wrong = check.wrong
        bare_floor(run, chosen, storm)
        killed_floor(run, chosen, storm)
    finally:
        run.resume_behaviours()
    return storm


def bare_floor(run: LoadRun, chosen: dict[int, list[int]], storm: Storm) -> None:
    """The same clients at once to a bare Channels consumer in a daphne process of its own,
    started for this and stopped after it (behaviours still paused)."""
    from tools.loadtest.servers import BARE, DaphneProcess

    daphne = DaphneProcess(
        run.sizes.processes, run.env, run.servers.log_dir, BARE, "bare", census=False
    )
    try:
        daphne.start()
        daphne.wait_ready()
        cpu_start = cpu_seconds(daphne.pid)
        parts = run.generators.bare_storm(daphne.port, chosen, STORM_TIMEOUT)
        storm.bare_cpu = cpu_seconds(daphne.pid) - cpu_start
    except RuntimeError as error:
        storm.bare_note = str(error)
        return
    finally:
        daphne.stop()
    storm.bare_in = _gathered(parts, storm.bare_failures)


def killed_floor(run: LoadRun, chosen: dict[int, list[int]], storm: Storm) -> None:
    """The same clients hold a socket to a bare Channels consumer in a daphne process of its
    own; it is killed and restarted as ours was (``Faults.kill_daphne``), and timed from its
    answer until every client, back through presence.js's backoff, had its frame again. Every
    process stopped and every client let go, also on failure (behaviours still paused)."""
    from tools.loadtest.servers import BARE, DaphneProcess

    daphne = DaphneProcess(
        run.sizes.processes, run.env, run.servers.log_dir, BARE, "bare-killed", census=False
    )
    parts: list[BareStorm] = []
    try:
        daphne.start()
        daphne.wait_ready()
        held = run.generators.bare_hold(daphne.port, chosen, STORM_TIMEOUT)
        if any(part.seconds is None for part in held):
            opened = sum(part.done for part in held)
            storm.killed_note = (
                f"{opened:,} of {storm.clients:,} held a socket within {STORM_TIMEOUT:.0f} s"
            )
            return
        killed_at = time.monotonic()
        daphne.kill()
        time.sleep(1.0)  # as Faults.kill_daphne
        daphne.start()
        daphne.wait_ready()
        answered = time.monotonic()
        storm.killed_restart = answered - killed_at
        cpu_start = cpu_seconds(daphne.pid)
        parts = run.generators.bare_again(answered, STORM_TIMEOUT)
        storm.killed_cpu = cpu_seconds(daphne.pid) - cpu_start
    except RuntimeError as error:
        storm.killed_note = str(error)
        return
    finally:
        try:
            run.generators.bare_release()
        finally:
            daphne.stop()
    storm.killed_in = _gathered(parts, storm.killed_failures)


def _gathered(parts: list[BareStorm], failures: dict[str, int]) -> float | None:
    """The generators' parts of a floor: their failed attempts added to ``failures``, and
    the seconds until the last client had its frame (None: not every one did)."""
    for part in parts:
        for kind, count in part.failures.items():
            failures[kind] = failures.get(kind, 0) + count
    seconds = [part.seconds for part in parts]
    return None if None in seconds else max(s or 0.0 for s in seconds)


def _compare(
    run: LoadRun,
    views: list[oracle.View],
    expected: dict[int, dict[int, PresenceTuple]],
) -> oracle.Comparison:
    return oracle.compare(views, expected, run.oracle.hidden, run.oracle.blocked_pairs, 1)
