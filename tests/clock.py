"""A fixed start time for tests that control the clock (see the ``clock`` fixture)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

T0 = datetime(2030, 1, 7, 9, 30, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """The time ``seconds`` after T0."""
    return T0 + timedelta(seconds=seconds)
