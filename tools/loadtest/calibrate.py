"""What bare Channels costs on this machine, and the page-view rate the load runs at (``--rate``).

Before the load, with the behaviours paused, a sample of the clients open a socket at once to a
bare Channels consumer behind ``AuthMiddlewareStack`` in a daphne process of its own (the
page-view benchmark's, ``benchmarks.page_views_asgi``: accept, read the user, one frame, close),
through the same handshake limit as a page view: that process's CPU per client is what a page
view's socket costs Channels and daphne themselves here. ``--rate auto`` (the default at full
size) runs the mix at the rate the machine carries: the servers working on page views for at
most ``SERVER_SHARE`` of the machine's cores, at ``PLANNED_RATIO`` times bare's cost each (the
goal; the run measures the real ratio). At the end, the servers' CPU per page view during the
load (all of their work, heartbeats, diffs and rooms included) is set beside bare's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

from tools.loadtest.faults import LoadRun

#: page views the calibration opens to the bare consumer at most
SAMPLE = 1000
#: how long the calibration may take before it is given up
TIMEOUT = 120.0
#: the machine's cores the servers may spend on page views: a quarter (the other half of the
#: machine is the generators', Redis's and the harness's on one host, and the deployment sizing
#: keeps processes at half load for bursts and storms)
SERVER_SHARE = 0.25
#: what a page view is planned to cost, in bare's (the page-view goal: at most twice)
PLANNED_RATIO = 2.0
#: the highest rate "auto" picks, page views per second per connection (the default mix's)
MAX_CHURN = 0.02


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


def measure_bare(run: LoadRun) -> Bare:
    """Bare Channels' CPU per page view on this machine (behaviours paused meanwhile)."""
    from tools.loadtest.servers import BARE, DaphneProcess
    from tools.loadtest.storm import cpu_seconds

    indices = sorted(run.oracle.positions)[:SAMPLE]
    chosen: dict[int, list[int]] = {}
    for index in indices:
        number, position = run.oracle.positions[index]
        chosen.setdefault(number, []).append(position)
    bare = Bare(clients=len(indices))
    daphne = DaphneProcess(run.sizes.processes, run.env, run.servers.log_dir, BARE, "calibration")
    run.generators.ask("pause")
    try:
        daphne.start()
        daphne.wait_ready()
        time.sleep(0.5)  # its start-up's CPU settles
        start = cpu_seconds(daphne.pid)
        parts = run.generators.bare_storm(daphne.port, chosen, TIMEOUT)
        bare.cpu = cpu_seconds(daphne.pid) - start
        seconds = [part.seconds for part in parts]
        bare.seconds = None if None in seconds else max(s or 0.0 for s in seconds)
        if bare.seconds is None:
            bare.note = f"not all answered within {TIMEOUT:.0f} s"
    except RuntimeError as error:
        bare.note = str(error)
    finally:
        daphne.stop()
        run.generators.ask("resume")
    return bare


def carried_rate(bare: Bare, connections: int) -> float | None:
    """Page views per second the machine carries (see the module's doc), or None."""
    per_view = bare.per_page_view
    if not per_view:
        return None
    cores = psutil.cpu_count() or 1
    rate = SERVER_SHARE * cores / (PLANNED_RATIO * per_view)
    return min(rate, MAX_CHURN * connections)


def cpu_row(server_cpu: float, page_views: int, bare: Bare | None) -> str:
    """The servers' CPU per page view during the load, beside bare's."""
    if not page_views:
        return "no page views during the load"
    ours = server_cpu / page_views
    text = (
        f"ours {ours * 1000:.2f} ms ({server_cpu:.1f} s over {page_views:,} page views, all of "
        "the servers' work counted: heartbeats, diffs, rooms)"
    )
    if bare is not None and bare.per_page_view:
        text += (
            f"; bare Channels {bare.per_page_view * 1000:.2f} ms: ratio "
            f"{ours / bare.per_page_view:.1f}"
        )
    return text
