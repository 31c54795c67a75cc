"""presence.gathering: the requests of one event loop moment answered by one call."""

from __future__ import annotations

import asyncio

import pytest

from presence.gathering import Gathering


async def test_requests_of_one_moment_are_answered_together_each_with_its_reply() -> None:
    calls: list[list[int]] = []

    async def double(requests: list[int]) -> list[int]:
        calls.append(requests)
        return [2 * request for request in requests]

    gathering = Gathering(double)
    assert await asyncio.gather(*(gathering.ask(n) for n in (1, 2, 3))) == [2, 4, 6]
    assert await gathering.ask(5) == 10  # a later moment: a call of its own
    assert calls == [[1, 2, 3], [5]]


async def test_an_answer_that_raises_fails_every_request_of_its_moment() -> None:
    async def broken(requests: list[int]) -> list[int]:
        raise ConnectionError("the server went away")

    gathering = Gathering(broken)
    first, second = gathering.ask(1), gathering.ask(2)
    for future in (first, second):
        with pytest.raises(ConnectionError, match="went away"):
            await future


async def test_a_cancelled_answer_leaves_no_request_waiting() -> None:
    started = asyncio.Event()

    async def never(requests: list[int]) -> list[int]:
        started.set()
        await asyncio.Event().wait()
        return requests

    gathering = Gathering(never)
    future = gathering.ask(1)
    await asyncio.wait_for(started.wait(), 5)
    (task,) = gathering._answering
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(future, 5)
