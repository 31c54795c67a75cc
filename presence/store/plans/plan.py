"""The plan type: the commands of one store operation, how to read their replies, and what to
answer when Redis is unavailable; several plans merged into one round trip; and
:class:`PlanArea`, what each area's plans stand on. No I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from presence.store.keys import KeyScheme
from presence.store.scripts import Script

T = TypeVar("T")


class Raise:
    """The type of :data:`RAISE` (a plan's fallback that is not a value)."""


#: a plan's fallback meaning "raise StoreUnavailable" (plans that must not fail silently)
RAISE = Raise()


@dataclass
class Plan(Generic[T]):
    """Commands sent together in one pipeline, and how to read their replies."""

    commands: list[tuple[Any, ...]]
    parse: Callable[[list[Any]], T]
    #: returned when Redis is unavailable; RAISE to raise StoreUnavailable instead
    fallback: T | Raise
    #: on a cluster with a master unavailable: reads the replies of the other masters (the
    #: unavailable ones' replies are the exceptions); None: the whole plan falls back
    partial: Callable[[list[Any]], T] | None = None


def merge(plans: Sequence[Plan[T]]) -> Plan[list[T]]:
    """Several plans as one (one round trip); falls back to each plan's fallback, or raises
    if any plan must not fail silently."""
    bounds: list[tuple[int, int]] = []
    commands: list[tuple[Any, ...]] = []
    for plan in plans:
        bounds.append((len(commands), len(commands) + len(plan.commands)))
        commands += plan.commands

    def parse(replies: list[Any]) -> list[T]:
        return [plan.parse(replies[a:b]) for plan, (a, b) in zip(plans, bounds, strict=True)]

    fallback: list[T] | Raise = RAISE
    partial: Callable[[list[Any]], list[T]] | None = None
    if not any(isinstance(plan.fallback, Raise) for plan in plans):
        fallback = [plan.fallback for plan in plans]  # type: ignore[misc]

        def partial(replies: list[Any]) -> list[T]:
            # Each plan whose commands all ran is read; the others fall back (or read partly).
            results: list[T] = []
            for plan, (a, b) in zip(plans, bounds, strict=True):
                part = replies[a:b]
                if not any(isinstance(reply, Exception) for reply in part):
                    results.append(plan.parse(part))
                elif plan.partial is not None:
                    results.append(plan.partial(part))
                else:
                    results.append(plan.fallback)  # type: ignore[arg-type]
            return results

    return Plan(commands=commands, parse=parse, fallback=fallback, partial=partial)


def script_call(script: Script, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
    return ("SCRIPT", script, tuple(keys), tuple(args))


class PlanArea:
    """The plans of one area (recording, schedules, rooms, ...), over the store's key scheme
    (``self.keys``) and settings. :class:`~presence.store.plans.Plans` composes the areas."""

    def __init__(self, keys: KeyScheme) -> None:
        self.keys = keys
        self.conf = keys.conf
