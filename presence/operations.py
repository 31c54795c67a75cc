"""Operations written once, run sync or async.

An operation of :mod:`presence.api` or :mod:`presence.lifecycle` is a generator: it computes
what it can by itself and yields the steps that need I/O, each answered with its result (or
raised into it, so an operation reads like straight-line code):

- :class:`Redis`: a store plan (:mod:`presence.store.plans`), run under the store's one
  failure policy;
- :class:`Call`: a blocking call (a database read or write, an announcement), with the
  coroutine function that does the same on an event loop where there is one; on an event loop,
  a call without one runs in the database's thread, and what it announces (its writes'
  receivers, its ``on_commit`` callbacks) is sent from the loop once it returns
  (:func:`presence.layer.sent_from_this_loop`): that thread never waits on the channel layer;
- :class:`Both`: two steps that need not wait for each other.

:func:`run` answers the steps in the caller's thread (``store.run``, the call itself, one step
after the other); :func:`arun` on the event loop (``store.arun``, the coroutine function or
else the call in a thread through ``sync_to_async``, both steps of :class:`Both` at once). Each
public function is then one line: ``run(_touch(user, device))`` and
``arun(_touch(user, device))``. The helpers :func:`redis`, :func:`call` and :func:`both` yield
one step and return its result typed (``state = yield from redis(plan)``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from asgiref.sync import sync_to_async

from presence import layer
from presence.steps import Steps
from presence.store import Plan, get_store

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Redis(Generic[T]):
    """Run ``plan`` on the store. ``live``: a call of the live paths (consumers, the hub,
    sweeps), which waits for a busy Redis (see :meth:`PresenceStore.arun`)."""

    plan: Plan[T]
    live: bool = False


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """``function(*args)``; on an event loop ``afunction(*args)`` where given, else
    ``function`` in a thread (``sync_to_async``: the database's thread), its announcements
    sent from the loop once it returns."""

    function: Callable[..., T]
    args: tuple[Any, ...]
    afunction: Callable[..., Awaitable[T]] | None = None


@dataclass(frozen=True, slots=True)
class Both:
    """Two steps at once (gathered on an event loop); answered with both results."""

    first: Step
    second: Step


Step: TypeAlias = Redis[Any] | Call[Any] | Both
#: an operation returning T: it yields steps and is sent their results
Operation: TypeAlias = Generator[Step, Any, T]


def redis(plan: Plan[T], live: bool = False) -> Operation[T]:
    """``result = yield from redis(plan)``: the plan's result."""
    result: T = yield Redis(plan, live)
    return result


def call(
    function: Callable[..., T],
    *args: Any,
    afunction: Callable[..., Awaitable[T]] | None = None,
) -> Operation[T]:
    """``result = yield from call(function, *args)``: its result."""
    result: T = yield Call(function, args, afunction)
    return result


def redis_then(plan: Plan[T], then: Callable[[T], None], live: bool = False) -> Operation[T]:
    """``result = yield from redis_then(plan, then)``: the plan's result, after ``then(result)``
    ran, even if the caller is cancelled meanwhile (a handler the server gave up on): on an
    event loop the round trip and ``then`` are shielded. For writes whose reply must not be
    lost (the transitions their scripts make, see presence.signals)."""

    def do() -> T:
        result = get_store().run(plan)
        then(result)
        return result

    async def ado() -> T:
        async def write() -> T:
            result = await get_store().arun(plan, live=live)
            then(result)
            return result

        return await asyncio.shield(asyncio.ensure_future(write()))

    result: T = yield Call(do, (), ado)
    return result


def both(first: Step, second: Step) -> Operation[tuple[Any, Any]]:
    """``a, b = yield from both(step_a, step_b)``: both steps' results."""
    result: tuple[Any, Any] = yield Both(first, second)
    return result


# --- the runners --------------------------------------------------------------------------------


def _do(step: Step) -> Any:
    if type(step) is Redis:
        return get_store().run(step.plan)
    if type(step) is Call:
        return step.function(*step.args)
    assert type(step) is Both
    first, second = step.first, step.second
    if type(first) is Redis and type(second) is Call:
        # Redis runs the plan while this thread does the call (a database query).
        finish = get_store().begin(first.plan)
        done = _after(finish, second)
        return finish(), done
    if type(first) is Call and type(second) is Redis:
        finish = get_store().begin(second.plan)
        return _after(finish, first), finish()
    return _do(first), _do(second)


def _after(finish: Callable[[], Any], call: Step) -> Any:
    """``call`` done while a plan's commands run; if it fails, the plan's replies are read
    all the same (its connection goes back to the pool) before the error is raised."""
    try:
        return _do(call)
    except BaseException:
        with contextlib.suppress(Exception):
            finish()
        raise


async def _ado(step: Step) -> Any:
    if type(step) is Redis:
        return await get_store().arun(step.plan, live=step.live)
    if type(step) is Call:
        if step.afunction is not None:
            return await step.afunction(*step.args)
        async with layer.sent_from_this_loop():
            return await sync_to_async(step.function)(*step.args)
    assert type(step) is Both
    return tuple(await asyncio.gather(_ado(step.first), _ado(step.second)))


def run(operation: Operation[T]) -> T:
    """Run ``operation`` in this thread: each step done in turn, its error raised into it."""
    steps = Steps(operation)
    for step in steps:
        try:
            steps.reply = _do(step)
        except Exception as failed:
            steps.failed = failed
    return steps.result


async def arun(operation: Operation[T]) -> T:
    """Run ``operation`` on this event loop: Redis through ``store.arun``, blocking calls
    through their coroutine function or in a thread."""
    steps = Steps(operation)
    for step in steps:
        try:
            steps.reply = await _ado(step)
        except Exception as failed:
            steps.failed = failed
    return steps.result


def being_cancelled() -> bool:
    """Whether the running task itself is being cancelled (its connection or the loop
    stopping), as opposed to a ``CancelledError`` raised by something it awaited: a bug below
    it, which its caller must handle as an error rather than end on."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
