"""presence.rooms.batches: items of one key submitted while its batch runs go together next;
a failure of the batch's work reaches each of its callers as an error they can handle."""

from __future__ import annotations

import asyncio

import pytest

from presence.rooms.batches import Batches


async def test_items_submitted_meanwhile_go_together_in_the_next_batch() -> None:
    ran: list[list[int]] = []
    release = asyncio.Event()

    async def run(key: str, items: list[int]) -> list[int | BaseException]:
        ran.append(items)
        await release.wait()
        return [item * 10 for item in items]

    batches: Batches[int, int] = Batches(run, 100)
    first = asyncio.ensure_future(batches.submit("k", 1))
    await asyncio.sleep(0.01)
    rest = [asyncio.ensure_future(batches.submit("k", n)) for n in (2, 3)]
    await asyncio.sleep(0.01)
    release.set()
    assert await asyncio.wait_for(asyncio.gather(first, *rest), 5) == [10, 20, 30]
    assert ran == [[1], [2, 3]]


async def test_a_cancelled_error_from_below_reaches_callers_as_an_error() -> None:
    """Something the batch awaited raised CancelledError (not a cancellation of the batch):
    its callers get an ordinary error, not a CancelledError that would end their tasks as if
    they were cancelled; the next batch of the key runs."""
    calls = 0

    async def run(key: str, items: list[int]) -> list[int | BaseException]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise asyncio.CancelledError()
        return items

    batches: Batches[int, int] = Batches(run, 100)
    with pytest.raises(RuntimeError, match="cancelled below"):
        await asyncio.wait_for(batches.submit("k", 1), 5)
    assert await asyncio.wait_for(batches.submit("k", 2), 5) == 2


class Gathering:
    """Batches whose gather waits for ``gathered``, counting the gathers; ``ran``: each batch
    run, in order."""

    def __init__(self, limit: int) -> None:
        self.ran: list[list[int]] = []
        self.gathers = 0
        self.gathered = asyncio.Event()
        self.batches: Batches[int, int] = Batches(self._run, limit, self._gather)

    async def _gather(self) -> None:
        self.gathers += 1
        await self.gathered.wait()

    async def _run(self, key: str, items: list[int]) -> list[int | BaseException]:
        self.ran.append(items)
        return items


async def test_a_gather_is_awaited_before_each_batch_and_items_arriving_meanwhile_go_with_it() -> (
    None
):
    g = Gathering(100)
    batches, ran = g.batches, g.ran
    first = asyncio.ensure_future(batches.submit("k", 1))
    await asyncio.sleep(0.01)
    later = [asyncio.ensure_future(batches.submit("k", n)) for n in (2, 3)]
    await asyncio.sleep(0.01)
    assert ran == [] and g.gathers == 1  # the first waits for the gather, not for more items
    g.gathered.set()
    assert await asyncio.wait_for(asyncio.gather(first, *later), 5) == [1, 2, 3]
    assert ran == [[1, 2, 3]]
    assert await asyncio.wait_for(batches.submit("k", 4), 5) == 4
    assert ran == [[1, 2, 3], [4]] and g.gathers == 2


async def test_a_caller_cancelled_during_the_gather_is_not_run_and_a_full_batch_goes_at_once() -> (
    None
):
    g = Gathering(3)
    batches, ran = g.batches, g.ran
    first = asyncio.ensure_future(batches.submit("k", 1))
    gone = asyncio.ensure_future(batches.submit("k", 2))
    await asyncio.sleep(0.01)
    gone.cancel()
    more = [asyncio.ensure_future(batches.submit("k", n)) for n in range(3, 9)]
    await asyncio.sleep(0.01)
    g.gathered.set()
    assert await asyncio.wait_for(asyncio.gather(first, *more), 5) == [1, *range(3, 9)]
    assert gone.cancelled()
    # After the gather, a full batch left waiting goes at once; the one item after it gathers.
    assert ran == [[1, 3, 4], [5, 6, 7], [8]] and g.gathers == 2
