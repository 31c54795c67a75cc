"""Batches: work of one key (a room's joins, presence.rooms.joins) done once for all the
items submitted while the key's previous batch was under way. No delay is added unless the
owner gives a ``gather`` (awaited before each batch, the items arriving meanwhile going with
it): an item alone goes at once, and items arriving meanwhile wait only for the batch before
theirs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from presence.operations import being_cancelled
from presence.store import StoreUnavailable

T = TypeVar("T")
R = TypeVar("R")


class Batches(Generic[T, R]):
    """Items of one key go together: one submitted while its key's batch is under way waits
    for it, then goes with every item that waited with it (at most ``limit``)."""

    def __init__(
        self,
        run: Callable[[Any, list[T]], Awaitable[list[R | BaseException]]],
        limit: int,
        gather: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._run = run
        self._limit = limit
        self._gather = gather
        self._queued: dict[Any, list[tuple[T, asyncio.Future[R]]]] = {}
        self._running: dict[Any, asyncio.Future[None]] = {}

    async def submit(self, key: Any, item: T, undo_after_run: bool = False) -> R:
        """``item``'s answer. Cancelled while its batch runs: with ``undo_after_run`` (the
        caller undoes what the batch did), the cancellation waits for the batch first."""
        answer: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        queued = self._queued.setdefault(key, [])
        entry = (item, answer)
        queued.append(entry)
        if key not in self._running:
            # Started on the loop's next turn: items whose frames arrived in the same turn go
            # together already.
            self._running[key] = asyncio.ensure_future(self._drain(key))
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            if entry in self._queued.get(key, ()):
                self._queued[key].remove(entry)  # not run: nothing to undo
            elif undo_after_run:
                # A leave written before the join it undoes would leave the join standing.
                with contextlib.suppress(BaseException):
                    await answer
            raise

    async def _drain(self, key: Any) -> None:
        try:
            while queued := self._queued.get(key):
                if self._gather is not None and len(queued) < self._limit:
                    # (a full batch waiting already goes at once)
                    await self._gather()
                queued = self._queued.pop(key, None)
                if not queued:
                    break
                batch, rest = queued[: self._limit], queued[self._limit :]
                if rest:
                    self._queued[key] = rest
                try:
                    answers = await self._run(key, [item for item, _ in batch])
                except BaseException as failure:
                    cancelled = isinstance(failure, asyncio.CancelledError)
                    if cancelled and not being_cancelled():
                        # Raised by something the batch awaited, not a cancellation of this
                        # batch: an error its callers handle (a CancelledError handed to them
                        # would end their consumers, their sockets left open unanswered).
                        failure = RuntimeError(f"a batch's work was cancelled below it: {key!r}")
                        cancelled = False
                    for _, answer in batch:
                        if not answer.done():
                            answer.set_exception(failure)
                    if cancelled:
                        raise
                    continue
                for (_, answer), result in zip(batch, answers, strict=True):
                    if answer.done():
                        continue
                    if isinstance(result, BaseException):
                        answer.set_exception(result)
                    else:
                        answer.set_result(result)
        finally:
            del self._running[key]
            for _, answer in self._queued.pop(key, []):
                if not answer.done():  # the loop is stopping
                    answer.set_exception(StoreUnavailable("the batch was not run"))
