"""The hub's channel (presence.hub.inbox): every message sent to it through a group arrives, in
the order sent, as receive gives it; on channels_redis's core layer a backlog is taken off in
batches, not one message per four round trips. On the layer under test (core, and pub/sub in
the pub/sub pass)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels.layers import get_channel_layer

from presence.hub import inbox
from tests.conftest import close_pubsub_layer

pytestmark = [pytest.mark.pubsub_layer, pytest.mark.cluster]

#: more than one batch
SENT = inbox.BATCH * 2 + 50
#: seconds any one read may take
READ_TIMEOUT = 10


@pytest.fixture
async def hub_channel() -> AsyncIterator[tuple[Any, str, str]]:
    """The layer, a hub channel and a group it is in (left, and the layer closed, after)."""
    layer = get_channel_layer()
    channel = await inbox.new_channel(layer)
    group = f"presence-test-inbox-{uuid.uuid4().hex}"
    await layer.group_add(group, channel)
    try:
        yield layer, channel, group
    finally:
        await layer.group_discard(group, channel)
        await close_pubsub_layer()


def core_layer(layer: Any) -> bool:
    return type(layer).__module__ == "channels_redis.core"


async def read(receive: inbox.Receive, count: int) -> list[list[dict[str, Any]]]:
    """Reads until ``count`` messages came: the batches as read."""
    batches: list[list[dict[str, Any]]] = []
    for _ in range(count):  # at least one message a read (an empty one: a wait timed out)
        batches.append(await asyncio.wait_for(receive(), READ_TIMEOUT))
        if sum(map(len, batches)) >= count:
            break
    return batches


async def test_a_backlog_arrives_whole_in_the_order_sent(hub_channel: tuple[Any, str, str]) -> None:
    layer, channel, group = hub_channel
    for n in range(SENT):
        await layer.group_send(group, {"type": "presence.test", "n": n})
    batches = await read(inbox.receiver(layer, channel), SENT)
    messages = [message for batch in batches for message in batch]
    assert messages == [{"type": "presence.test", "n": n} for n in range(SENT)]
    if core_layer(layer):
        # Taken off in batches: three reads for two and a quarter batches.
        assert [len(batch) for batch in batches] == [inbox.BATCH, inbox.BATCH, 50]


async def test_a_read_of_an_empty_channel_waits_for_the_next_message(
    hub_channel: tuple[Any, str, str],
) -> None:
    layer, channel, group = hub_channel
    receive = inbox.receiver(layer, channel)
    waiting = asyncio.ensure_future(receive())
    await asyncio.sleep(0.2)  # the read is blocked on the empty channel (real time: I/O)
    assert not waiting.done()
    await layer.group_send(group, {"type": "presence.test", "n": 1})
    assert await asyncio.wait_for(waiting, READ_TIMEOUT) == [{"type": "presence.test", "n": 1}]


async def test_the_hubs_channel_takes_the_capacity_set_for_the_process_channels(
    hub_channel: tuple[Any, str, str],
) -> None:
    layer, channel, _ = hub_channel
    if not core_layer(layer):
        assert channel.startswith(layer.prefix)  # the layer's own kind of channel
        return
    # docs/deployment.md sets channel_capacity for "specific.*": the hub's channel matches it.
    assert channel.startswith(f"specific.{layer.client_prefix}.hub")
    assert "!" not in channel  # its messages in a set of its own, not the consumers'
    assert layer.get_capacity(channel) == layer.get_capacity(await layer.new_channel())
