"""A fault's window (``--faults``): the run keeps the list (``Run.windows``), the faults open
them (``Faults.inject``), and the report excuses what happened inside them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tools.loadtest import config


@dataclass
class Window:
    """A fault's window: from its start until its end plus the convergence bound."""

    name: str
    start: float
    end: float = 0.0
    converged_in: float | None = None
    wrong_after: int = 0
    note: str = ""

    def covers(self, at: float) -> bool:
        return self.start <= at <= (self.end or time.time()) + config.CONVERGENCE_BOUND
