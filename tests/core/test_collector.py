"""presence.collector: full collections walk only what is younger than the last one, and
everything once per period (the cyclic garbage among the long-lived objects found then)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from presence.collector import collect_in_short_pauses, stop_collecting_in_short_pauses


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Node:
    """Half of a reference cycle: freed only by a collection that walks it."""

    other: Node | None = None


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def clock() -> Iterator[Clock]:
    clock = Clock()
    gc.unfreeze()
    collect_in_short_pauses(unfreeze_every=300, clock=clock)
    try:
        yield clock
    finally:
        stop_collecting_in_short_pauses()
        gc.unfreeze()
        gc.collect()


def test_a_full_collection_freezes_what_survived_it(clock: Clock) -> None:
    assert gc.get_freeze_count() == 0
    kept = Node()
    gc.collect()
    assert gc.get_freeze_count() > 0
    assert gc.is_tracked(kept) and kept not in gc.get_objects(generation=2)


def test_garbage_made_after_the_last_full_collection_is_collected_by_the_next(
    clock: Clock,
) -> None:
    gc.collect()
    young = cycle()
    gc.collect()
    assert young() is None


def test_a_long_lived_cycle_dropped_waits_for_the_period_then_is_collected(clock: Clock) -> None:
    holder = [Node()]
    holder[0].other = holder[0]
    old = weakref.ref(holder[0])
    gc.collect()  # it survives: frozen
    holder.clear()
    clock.now += 299
    gc.collect()
    assert old() is not None, "frozen: this collection did not walk it"
    clock.now += 1
    gc.collect()
    assert old() is None, "the period's collection walks everything"


def test_stopping_gives_python_its_own_collections_back(clock: Clock) -> None:
    stop_collecting_in_short_pauses()
    gc.unfreeze()
    holder = [Node()]
    holder[0].other = holder[0]
    old = weakref.ref(holder[0])
    gc.collect()
    assert gc.get_freeze_count() == 0
    holder.clear()
    gc.collect()
    assert old() is None


def test_a_period_that_is_not_positive_is_refused_and_the_policy_in_place_stays(
    clock: Clock,
) -> None:
    for period in (0, -5):
        with pytest.raises(ValueError, match="unfreeze_every must be a positive number"):
            collect_in_short_pauses(unfreeze_every=period)
    gc.collect()
    assert gc.get_freeze_count() > 0, "the policy installed before still freezes"
