"""The plan type: the commands of one store operation, how to read their replies, and what to
answer when Redis is unavailable; several plans merged into one round trip; and
:class:`PlanArea`, what each area's plans stand on. No I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from presence.store.keys import KeyScheme
from presence.store.scripts import READ_COMMANDS, Script

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
    #: {command: an earlier command}: on a cluster, the command is sent only once the earlier
    #: one succeeded (a round trip later; its reply otherwise an exception), and so is every
    #: later command of its slot, which Redis would have run after it. One Redis runs a
    #: pipeline in order: a plan for it needs none (its failure there is the whole Redis's).
    needs: dict[int, int] = field(default_factory=dict)


def merge(plans: Sequence[Plan[T]]) -> Plan[list[T]]:
    """Several plans as one (one round trip); falls back to each plan's fallback, or raises
    if any plan must not fail silently."""
    commands, needs, bounds = _together(plans)

    def parse(replies: list[Any]) -> list[T]:
        return [plan.parse(replies[a:b]) for plan, (a, b) in zip(plans, bounds, strict=True)]

    fallback: list[T] | Raise = RAISE
    partial: Callable[[list[Any]], list[T]] | None = None
    if not any(isinstance(plan.fallback, Raise) for plan in plans):
        fallback = [plan.fallback for plan in plans]  # type: ignore[misc]

        def partial(replies: list[Any]) -> list[T]:
            # Each plan whose commands all ran is read; the others fall back (or read partly).
            return [
                _read_partly(plan, replies[a:b]) for plan, (a, b) in zip(plans, bounds, strict=True)
            ]

    return Plan(commands=commands, parse=parse, fallback=fallback, partial=partial, needs=needs)


def merge_apart(plans: Sequence[Plan[T]]) -> Plan[list[T | None]]:
    """:func:`merge`, each plan answered apart: on a cluster with a master unavailable, a plan
    that must not fail silently (RAISE) whose commands did not all run reads None, and the
    others' results stand (a batch over every master: a room sweep, cleanup). Raises when no
    command ran at all (Redis unavailable)."""
    commands, needs, bounds = _together(plans)

    def parse(replies: list[Any]) -> list[T | None]:
        return [plan.parse(replies[a:b]) for plan, (a, b) in zip(plans, bounds, strict=True)]

    def partial(replies: list[Any]) -> list[T | None]:
        return [
            _read_partly(plan, replies[a:b]) for plan, (a, b) in zip(plans, bounds, strict=True)
        ]

    return Plan(commands=commands, parse=parse, fallback=RAISE, partial=partial, needs=needs)


def _together(
    plans: Sequence[Plan[Any]],
) -> tuple[list[tuple[Any, ...]], dict[int, int], list[tuple[int, int]]]:
    """The plans' commands in one list, what they need first, and each plan's bounds in it."""
    bounds: list[tuple[int, int]] = []
    commands: list[tuple[Any, ...]] = []
    needs: dict[int, int] = {}
    for plan in plans:
        start = len(commands)
        needs.update({start + later: start + first for later, first in plan.needs.items()})
        bounds.append((start, start + len(plan.commands)))
        commands += plan.commands
    return commands, needs, bounds


def _read_partly(plan: Plan[T], replies: list[Any]) -> Any:
    """A plan's part of a merged plan's replies, some of them failed: read if its commands all
    ran, partly if it can be, else its fallback (None for RAISE)."""
    if not any(isinstance(reply, Exception) for reply in replies):
        return plan.parse(replies)
    if plan.partial is not None:
        return plan.partial(replies)
    return None if isinstance(plan.fallback, Raise) else plan.fallback


def script_call(script: Script, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
    return ("SCRIPT", script, tuple(keys), tuple(args))


def reads_only(command: tuple[Any, ...]) -> bool:
    """Whether a plan's command only reads (run again, it changes nothing): a script that
    calls only commands of READ_COMMANDS, or one of those commands."""
    if command[0] == "SCRIPT":
        return bool(command[1].reads_only)
    return str(command[0]).upper() in READ_COMMANDS


class PlanArea:
    """The plans of one area (recording, schedules, rooms, ...), over the store's key scheme
    (``self.keys``) and settings. :class:`~presence.store.plans.Plans` composes the areas."""

    def __init__(self, keys: KeyScheme) -> None:
        self.keys = keys
        self.conf = keys.conf
