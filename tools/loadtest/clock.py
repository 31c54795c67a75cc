"""The load's own time: the seconds with the behaviours running.

Checkpoints, the reconnect storm, the faults' convergence checks and the final check pause the
behaviours (and the harness's relation changes) while views are compared with the oracle; on a
busy machine a check takes minutes. So the load's ``--seconds``, its schedule, its "load
duration", and its figures per second or per page view count only the time the behaviours ran
and what happened meanwhile, not the checks.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field


@dataclass
class Running:
    """The intervals with the behaviours running, on the wall clock (``time.time()``: the clock
    the clients stamp their changes with)."""

    #: (resumed at, paused at or None while running)
    intervals: list[tuple[float, float | None]] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return bool(self.intervals) and self.intervals[-1][1] is None

    def resume(self, now: float) -> None:
        if not self.running:
            self.intervals.append((now, None))

    def pause(self, now: float) -> None:
        if self.running:
            self.intervals[-1] = (self.intervals[-1][0], now)

    def seconds(self, now: float) -> float:
        """Seconds with the behaviours running up to ``now``."""
        return sum((now if end is None else end) - start for start, end in self.intervals)

    def wall_at(self, seconds: float) -> float | None:
        """The wall time at which the behaviours had run ``seconds``; None if they had not
        (yet): an interval still running is counted as if it went on."""
        left = seconds
        for start, end in self.intervals:
            if end is None or end - start >= left:
                return start + left
            left -= end - start
        return None


@dataclass
class Tally:
    """A counter's growth over the running intervals only (CPU seconds by process, sockets
    opened by generator), read at each resume and each pause. A key first read at a pause
    counts from zero (a process started meanwhile counts from its start)."""

    total: float = 0.0
    since: dict[Hashable, float] | None = None

    def resume(self, readings: Mapping[Hashable, float]) -> None:
        if self.since is None:
            self.since = dict(readings)

    def pause(self, readings: Mapping[Hashable, float]) -> None:
        if self.since is None:
            return
        for key, value in readings.items():
            self.total += value - self.since.get(key, 0.0)
        self.since = None
