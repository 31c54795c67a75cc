"""The reconnect storm (``--storm``): every client of one server process reconnecting at once.

The process is killed (SIGKILL) and started again on its port; its clients see their socket
drop and reconnect by themselves, as ``presence.js`` does. Measured: the seconds from the
restarted process answering until every one of its clients is open again with a view that
agrees with the oracle. The behaviours are paused meanwhile, so what every view should show is
computed once before the kill, and read again only for the views that differ from it (the
harness's own ``bulk_presence`` calls are mostly not counted in the storm's time); a fresh
oracle check of every view at the end confirms it.

Then the floor, side by side in the same run: the same clients open a socket at once to a bare
Channels consumer behind ``AuthMiddlewareStack`` in a daphne process of its own (the page-view
benchmark's, ``benchmarks.page_views_asgi``: accept, read the user, one frame, close), through
the same handshake limit and backoff. What the storm costs beyond that is presence's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tools.loadtest import oracle
from tools.loadtest.faults import Faults, LoadRun
from tools.loadtest.generator import PresenceTuple
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
    #: the floor: seconds until every client had the bare consumer's frame (None: not within
    #: STORM_TIMEOUT), that process's CPU seconds meanwhile, failed attempts by kind
    bare_in: float | None = None
    bare_cpu: float = 0.0
    bare_failures: dict[str, int] = field(default_factory=dict)
    #: the bare floor was not measured (and why)
    bare_note: str = ""

    def cpu_per_client(self) -> float:
        """The restarted process's CPU seconds per client until every view was right: what a
        storm costs whatever else the machine was doing (its wall time depends on that)."""
        return self.server_cpu / self.clients if self.clients else 0.0

    def ratio(self) -> float | None:
        """The storm's time over the bare floor's: how many times Channels' own it takes."""
        if self.right_in is None or not self.bare_in:
            return None
        return self.right_in / self.bare_in

    def floor_row(self) -> str:
        """The bare consumer's storm beside ours, and the ratio."""
        if self.bare_note:
            return f"not measured ({self.bare_note})"
        failures = (
            ", ".join(f"{count} {kind}" for kind, count in sorted(self.bare_failures.items()))
            or "none"
        )
        bare = (
            f"all {self.clients:,} had their frame in {self.bare_in:.1f} s"
            if self.bare_in is not None
            else f"not all had their frame within {STORM_TIMEOUT:.0f} s"
        )
        ratio = self.ratio()
        if ratio is not None:
            ours = f"ours {self.right_in:.1f} s: ratio {ratio:.1f}"
        elif self.right_in is None and self.bare_in:
            # Not all right within the timeout: the ratio is at least that far.
            ours = (
                f"ours not all right within {STORM_TIMEOUT:.0f} s: ratio above "
                f"{STORM_TIMEOUT / self.bare_in:.1f}"
            )
        else:
            ours = (f"ours {self.right_in:.1f} s" if self.right_in else "ours not all right") + (
                ": no ratio"
            )
        return (
            f"a bare Channels consumer behind AuthMiddlewareStack: {bare} (its CPU "
            f"{self.bare_cpu:.1f} s, {self.bare_cpu / max(1, self.clients) * 1000:.1f} ms per "
            f"client; failed attempts: {failures}); {ours}"
        )

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
    run.generators.ask("pause")
    run.relations.pause()
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
    finally:
        run.relations.resume()
        run.generators.ask("resume")
    return storm


def bare_floor(run: LoadRun, chosen: dict[int, list[int]], storm: Storm) -> None:
    """The same clients at once to a bare Channels consumer in a daphne process of its own,
    started for this and stopped after it (behaviours still paused)."""
    from tools.loadtest.servers import BARE, DaphneProcess

    daphne = DaphneProcess(run.sizes.processes, run.env, run.servers.log_dir, BARE, "bare")
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
    for part in parts:
        for kind, count in part.failures.items():
            storm.bare_failures[kind] = storm.bare_failures.get(kind, 0) + count
    seconds = [part.seconds for part in parts]
    storm.bare_in = None if None in seconds else max(s or 0.0 for s in seconds)


def _compare(
    run: LoadRun,
    views: list[oracle.View],
    expected: dict[int, dict[int, PresenceTuple]],
) -> oracle.Comparison:
    return oracle.compare(views, expected, run.oracle.hidden, run.oracle.blocked_pairs, 1)
