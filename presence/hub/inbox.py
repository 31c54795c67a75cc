"""The hub's channel: every announcement for this process arrives there, so it is read in
batches where the layer allows.

channels_redis's core layer reads a channel one message per ``receive``, each in four round
trips to Redis (a cleanup script, ``BZPOPMIN``, the in-flight backup written, then removed),
the next waiting for the last: at most a few thousand messages a second on an idle machine,
far fewer on a busy one, whatever the process's CPU. Processes that got more fell behind their
channels together. So on that layer the hub listens on a channel of its own (its messages in
one sorted set, not the process's ``specific.<process>!`` set its consumers share) and takes
up to :data:`BATCH` messages off it in one ``ZPOPMIN``, blocking in ``BZPOPMIN`` only when it is
empty. Messages leave in the order they were sent (the set is scored by the senders' clocks),
as ``receive`` gives them. What the backup protects, a message popped while its receive is
cancelled, is moot here: the hub's receive loop is cancelled only when the hub stops, and then
nobody is left to deliver to. Other layers are read with their own ``receive``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from presence.layer import CORE_LAYER, layer_kind

#: messages taken off the channel in one round trip
BATCH = 200

Receive = Callable[[], Awaitable[list[dict[str, Any]]]]


def _batched(layer: Any) -> bool:
    return layer_kind(layer) == CORE_LAYER


async def new_channel(layer: Any) -> str:
    """A new channel for the hub: on channels_redis's core layer one whose messages are kept
    apart (no ``!``), named after the process's channels (``specific.<process>.hub<id>``: the
    capacity set for ``specific.*`` applies); elsewhere the layer's own."""
    if _batched(layer):
        return f"specific.{layer.client_prefix}.hub{uuid.uuid4().hex}"
    return str(await layer.new_channel())


def receiver(layer: Any, channel: str) -> Receive:
    """What reads ``channel`` (made by :func:`new_channel`): the next messages in the order
    they were sent, at least one (an empty list when a blocking wait timed out)."""
    if not _batched(layer):

        async def one() -> list[dict[str, Any]]:
            return [await layer.receive(channel)]

        return one

    key = layer.prefix + channel
    index = layer.consistent_hash(channel)

    async def batch() -> list[dict[str, Any]]:
        connection = layer.connection(index)
        popped = await connection.zpopmin(key, BATCH)
        if not popped:
            waited = await connection.bzpopmin(key, timeout=layer.brpop_timeout)
            if waited is None:
                return []
            popped = [(waited[1], waited[2])]
        messages = [layer.deserialize(member) for member, _ in popped]
        for message in messages:
            # The channels a group's message was sent to, which receive strips too.
            message.pop("__asgi_channel__", None)
        return messages

    return batch
