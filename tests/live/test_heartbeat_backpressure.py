"""A heartbeat the store could not record (back-pressure: every pooled Redis connection busy for
the pool's whole wait) is not taken for written: the connection's next heartbeat writes, even
within half an interval of the failed one (benchmarks/bench_heartbeats.py counts such
heartbeats as "not recorded" on a saturated machine; none of their connections stays unwritten).

Helpers: tests/live/sockets.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import time_machine

from presence.store import get_store
from tests.clock import at
from tests.live.sockets import Sockets, connections_in_redis, heartbeat, new_user
from tests.live.sockets import _base_settings as _base_settings
from tests.live.sockets import sockets as sockets

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_async_db_connections"),
    pytest.mark.uuid_site,
    pytest.mark.pubsub_layer,
]


async def test_a_heartbeat_the_store_could_not_record_is_written_by_the_next_one(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    user = await new_user(make_user)
    tab = await sockets.open(user)

    async def last_written() -> int:
        (entry,) = await connections_in_redis(user)
        return int(entry.split(":")[4]) - int(at(0).timestamp())

    clock.shift(20)  # past half of HEARTBEAT_INTERVAL (30 s): the next beat writes
    pool: Any = get_store().async_client.connection_pool
    # Every pooled connection is busy (slow callers), and stays so past the pool's wait.
    held = [await pool.get_connection() for _ in range(pool.max_connections)]
    wait, pool.timeout = pool.timeout, 0.1
    try:
        await heartbeat(tab)
    finally:
        pool.timeout = wait
        for connection in held:
            await pool.release(connection)
    assert await last_written() == 0  # not recorded: the store answered with its fallback
    clock.shift(1)  # well within half an interval of the failed beat, no change of state
    await heartbeat(tab)
    assert await last_written() == 21


async def test_a_change_of_state_the_store_could_not_record_is_written_by_the_next_beat(
    sockets: Sockets, make_user: Callable[..., Any], clock: time_machine.Coordinates
) -> None:
    # A change is written at once, whatever the last write's age; one that failed is still a
    # change for the next beat (it was not: "idle" waited for half an interval since the last
    # write that succeeded, while the user's tab said idle).
    user = await new_user(make_user)
    tab = await sockets.open(user)

    async def written() -> tuple[int, str]:
        (entry,) = await connections_in_redis(user)
        fields = entry.split(":")
        return int(fields[4]) - int(at(0).timestamp()), fields[2]

    clock.shift(5)
    pool: Any = get_store().async_client.connection_pool
    held = [await pool.get_connection() for _ in range(pool.max_connections)]
    wait, pool.timeout = pool.timeout, 0.1
    try:
        await heartbeat(tab, "idle")
    finally:
        pool.timeout = wait
        for connection in held:
            await pool.release(connection)
    assert await written() == (0, "0")  # nothing recorded: still active, as of the open
    clock.shift(1)
    await heartbeat(tab, "idle")
    assert await written() == (6, "1")
