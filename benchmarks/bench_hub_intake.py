"""hub_intake: how fast a process takes announcements off its channel, side by side.

Every announcement for a process reaches its hub's one channel, so the rate the hub reads that
channel caps what the process can take in, whatever its CPU. On channels_redis's core layer:

- **receive** (the layer's own, what the hub used before): one message per call, each in four
  round trips to Redis, the next waiting for the last;
- **inbox** (presence.hub.inbox, the hub's read now): up to ``inbox.BATCH`` messages in one
  ``ZPOPMIN``.

Both channels get the same backlog of ``group_send`` messages (one group holding both, shaped
as an announcement); each is then drained, one after the other in a shuffled order, and timed.
The ratio is the drain rate of the inbox over receive's.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

from channels_redis.core import RedisChannelLayer

from benchmarks.common import Report, Sizes, redis_url, say
from presence.hub import inbox

NAME = "hub_intake"
#: the backlog drained (quick: a fifth)
MESSAGES = 5_000
#: the drain rate the inbox must reach over receive's
GOAL = 10.0


async def _drain(receive: Any, count: int) -> float:
    started = time.perf_counter()
    got = 0
    while got < count:
        got += len(await receive())
    return time.perf_counter() - started


async def _side_by_side(count: int) -> dict[str, float]:
    layer = RedisChannelLayer(
        hosts=[redis_url()],
        prefix=f"bench-intake-{uuid.uuid4().hex[:8]}",
        capacity=count + 100,
    )
    theirs = await layer.new_channel()
    ours = await inbox.new_channel(layer)
    group = "bench-intake"
    await layer.group_add(group, theirs)
    await layer.group_add(group, ours)
    message = {"type": "presence.changed", "users": [12345], "at": time.time()}
    for _ in range(count):
        await layer.group_send(group, message)

    async def one_by_one() -> list[Any]:
        return [await layer.receive(theirs)]

    readers = {"receive": one_by_one, "inbox": inbox.receiver(layer, ours)}
    order = list(readers)
    random.shuffle(order)
    seconds = {name: await _drain(readers[name], count) for name in order}
    await layer.flush()
    return {name: count / spent for name, spent in seconds.items()}


def run(sizes: Sizes, report: Report) -> None:
    count = MESSAGES // 5 if report.quick else MESSAGES
    say(f"\n== hub_intake: a backlog of {count:,} announcements taken off the hub's channel ==")
    rates = asyncio.run(_side_by_side(count))
    ratio = rates["inbox"] / rates["receive"]
    report.add(NAME, "channels_redis receive, one message a call", f"{rates['receive']:,.0f}/s")
    report.add(
        NAME, f"the hub's inbox, up to {inbox.BATCH} a round trip", f"{rates['inbox']:,.0f}/s"
    )
    report.add(
        NAME,
        "hub_intake: inbox / receive",
        f"{ratio:.1f}x",
        f">= {GOAL:.0f}x",
        ratio >= GOAL,
    )
