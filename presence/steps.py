"""The driver of an operation written as a generator of I/O steps.

Presence writes an operation once, as a generator that yields what it needs done (a Redis plan,
a database call, a cluster round) and receives each step's reply; a sync and an async runner do
the steps. :class:`Steps` is the part both runners share: iterating it gives each step in turn,
with the previous step's ``reply`` sent in or its ``failed`` error raised in; ``result`` is the
operation's value once iteration stops.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Generic, TypeVar

S = TypeVar("S")
T = TypeVar("T")


class Steps(Generic[S, T]):
    def __init__(self, operation: Generator[S, Any, T]) -> None:
        self._operation = operation
        #: the reply of the step just done, sent into the operation at the next one
        self.reply: Any = None
        #: the error of the step just done, raised into the operation at the next one
        self.failed: Exception | None = None
        self.result: T

    def __iter__(self) -> Steps[S, T]:
        return self

    def __next__(self) -> S:
        reply, failed = self.reply, self.failed
        self.reply, self.failed = None, None
        try:
            if failed is None:
                return self._operation.send(reply)
            return self._operation.throw(failed)
        except StopIteration as done:
            self.result = done.value
            raise
