"""A bounded memo for the hot paths' small pure functions (ids as JSON strings, presences as
JSON, scores as states, seconds as datetimes).

``functools.lru_cache`` keeps each entry in a list of its own, and lists are never out of the
garbage collector's sight: tens of thousands of them in a busy process, walked by every full
collection (the pauses a live fan-out waits behind), for as long as the process lives. Here the
entries are a plain dict's, which holds no object of its own per entry and, holding only strings
and numbers, is not walked at all. Full, it starts again empty: the working sets of these
functions are far smaller than their bounds, and a miss costs one call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from functools import update_wrapper
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MISSING: Any = object()


class BoundedMemo(Generic[K, V]):
    """``function`` of one hashable argument, memoised in at most ``maxsize`` entries."""

    def __init__(self, function: Callable[[K], V], maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize!r}.")
        self.function = function
        self.maxsize = maxsize
        self.entries: dict[K, V] = {}
        update_wrapper(self, function)

    def __call__(self, key: K) -> V:
        value = self.entries.get(key, _MISSING)
        if value is _MISSING:
            if len(self.entries) >= self.maxsize:
                self.entries = {}  # a new dict: a cleared one keeps its full-size table
            value = self.entries[key] = self.function(key)
        return value

    def cache_clear(self) -> None:
        self.entries = {}


def bounded_memo(maxsize: int) -> Callable[[Callable[[K], V]], BoundedMemo[K, V]]:
    """Decorator: :class:`BoundedMemo` of ``maxsize`` entries."""

    def decorate(function: Callable[[K], V]) -> BoundedMemo[K, V]:
        return BoundedMemo(function, maxsize)

    return decorate
