"""Who used the CPU during the load, and whether the machine had any left.

On a small machine the generators, Redis and the database share the cores with the servers: a
run whose machine was busy all the time measures the machine, not presence. The harness samples
the CPU seconds of each process it started (by pid, so a restarted server counts from its
start) and the machine's busy time, and prints both as cores used.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import psutil

#: a run whose machine was busier than this is reported as saturated
SATURATED = 0.9


def _cpu_seconds(pid: int) -> float | None:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


def _machine_busy_seconds() -> tuple[float, float]:
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    return sum(times) - idle, idle


class CpuMeter:
    """CPU seconds per group of processes between :meth:`start` and the last :meth:`sample`.

    ``groups`` returns, at each sample, the pids of each group ("servers", "generators", …);
    a pid's seconds count from its first sample (or from its start, if it started since) to its
    last one, so a process killed in between keeps what it used until then."""

    def __init__(self, groups: Callable[[], dict[str, Iterable[int | None]]]) -> None:
        self.groups = groups
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.group_of: dict[int, str] = {}
        self.started_at = 0.0
        self.ended_at = 0.0
        self.machine_start = (0.0, 0.0)
        self.machine_end = (0.0, 0.0)

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.machine_start = _machine_busy_seconds()
        self._sample(at_start=True)

    def sample(self) -> None:
        self.ended_at = time.monotonic()
        self.machine_end = _machine_busy_seconds()
        self._sample(at_start=False)

    def _sample(self, at_start: bool) -> None:
        for group, pids in self.groups().items():
            for pid in pids:
                if not pid:
                    continue
                seconds = _cpu_seconds(pid)
                if seconds is None:
                    continue
                if pid not in self.first:
                    # A process started since the first sample counts from its start.
                    self.first[pid] = seconds if at_start else 0.0
                    self.group_of[pid] = group
                self.last[pid] = seconds

    def cores(self) -> dict[str, list[float]]:
        """Cores used by each process of each group over the measured time (a restarted
        server's or Redis's new process is another entry)."""
        elapsed = max(1e-9, self.ended_at - self.started_at)
        used: dict[str, list[float]] = {}
        for pid, first in self.first.items():
            share = (self.last[pid] - first) / elapsed
            used.setdefault(self.group_of[pid], []).append(share)
        return used

    def seconds(self, group: str) -> float:
        """CPU seconds the processes of ``group`` used over the measured time."""
        mine = [pid for pid in self.first if self.group_of[pid] == group]
        return sum(self.last[pid] - self.first[pid] for pid in mine)

    def readings(self, group: str) -> dict[int, float]:
        """The CPU seconds of each process of ``group`` at the last sample (a dead one's at the
        last sample that saw it), by pid."""
        return {pid: self.last[pid] for pid in self.first if self.group_of[pid] == group}

    def machine_busy(self) -> float:
        """The machine's busy share of all its cores over the measured time (0 to 1)."""
        busy = self.machine_end[0] - self.machine_start[0]
        idle = self.machine_end[1] - self.machine_start[1]
        return busy / (busy + idle) if busy + idle > 0 else 0.0

    def row(self) -> str:
        """``servers 1.21 (0.40 at most in one); generators 0.35; …; machine busy 97 % of 2
        cores``: each group's cores in all, and the busiest process of a group of several."""
        parts = []
        for group, shares in self.cores().items():
            text = f"{group} {sum(shares):.2f}"
            if len(shares) > 1:
                text += f" ({max(shares):.2f} at most in one)"
            parts.append(text)
        busy = self.machine_busy()
        parts.append(f"machine busy {busy * 100:.0f} % of {psutil.cpu_count() or 1} cores")
        return "; ".join(parts)

    @property
    def saturated(self) -> bool:
        return self.machine_busy() >= SATURATED
