"""Faults injected during the load (``--faults``); filled in below."""

from __future__ import annotations

from typing import Any


class Faults:
    def __init__(self, run: Any) -> None:
        self.run = run

    def names(self) -> list[str]:
        return []

    def inject(self, name: str) -> None:
        raise NotImplementedError(name)
