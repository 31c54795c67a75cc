"""The run's table and its one final line, which scripts read."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(samples: Sequence[float], fraction: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1000:.0f}"


def p50_p99(samples: Sequence[float]) -> str:
    """``"p50 / p99"`` of ``samples`` in ms."""
    return f"{ms(percentile(samples, 0.5))} / {ms(percentile(samples, 0.99))}"


def final_line(
    connections: int,
    processes: int,
    p50: float | None,
    p99: float | None,
    lost: int,
    wrong: int,
    leaked: int,
    errors: int,
) -> str:
    return (
        f"load: {connections} connections, {processes} processes, p50 {ms(p50)} ms, "
        f"p99 {ms(p99)} ms, lost {lost}, wrong {wrong}, leaked {leaked}, errors {errors}"
    )


def table(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name.ljust(width)}  {value}" for name, value in rows)


def median(samples: Sequence[float]) -> float | None:
    return statistics.median(samples) if samples else None
