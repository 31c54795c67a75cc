"""Requests made in one moment of an event loop, answered together by one piece of I/O.

A saturated process has many sockets asking Redis at once (page views opening, subscribing,
closing, announcing); a round trip each costs a socket write, a read and the pool's
bookkeeping. A :class:`Gathering` collects the requests made while the event loop runs the
callbacks already due and answers them all in the next round of the loop, with one call of its
``answer`` (a list of requests in, one reply per request out). Nothing waits for more requests
to come: a lone request goes out one loop round later, no longer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

Request = TypeVar("Request")
Reply = TypeVar("Reply")
T = TypeVar("T")


class Gathering(Generic[Request, Reply]):
    def __init__(self, answer: Callable[[list[Request]], Awaitable[Sequence[Reply]]]) -> None:
        self._answer = answer
        self._waiting: list[tuple[Request, asyncio.Future[Reply]]] = []
        #: the answers under way (a reference to each task until it is done)
        self._answering: set[asyncio.Task[None]] = set()

    def ask(self, request: Request) -> asyncio.Future[Reply]:
        """The future reply to ``request``: its reply, or the exception ``answer`` raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        self._waiting.append((request, future))
        if len(self._waiting) == 1:
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        batch, self._waiting = self._waiting, []
        task = asyncio.ensure_future(self._run(batch))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _run(self, batch: list[tuple[Request, asyncio.Future[Reply]]]) -> None:
        try:
            replies = await self._answer([request for request, _ in batch])
        except Exception as error:
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
                    future.add_done_callback(_retrieve)
            return
        except BaseException:
            # Cancelled (the loop closing): no request may wait for an answer that never comes.
            for _, future in batch:
                future.cancel()
            raise
        for (_, future), reply in zip(batch, replies, strict=True):
            if not future.done():  # its caller may have been cancelled meanwhile
                future.set_result(reply)


def split_as(parts: Sequence[Sequence[Any]], flat: Sequence[T]) -> list[list[T]]:
    """``flat`` (the replies to every part's items, in order, as one batch answers them) cut
    back into one list per part, each as long as its part."""
    answers: list[list[T]] = []
    start = 0
    for part in parts:
        answers.append(list(flat[start : start + len(part)]))
        start += len(part)
    return answers


def _retrieve(future: asyncio.Future[Any]) -> None:
    # A caller cancelled meanwhile never reads its exception: no "never retrieved" warning.
    if not future.cancelled():
        future.exception()
