"""The hub's joins and leaves of channel-layer groups go together: on channels_redis's core layer
one script call per layer server runs the same commands as the layer's own calls (a ZADD and an
EXPIRE per join, a ZREM per leave), and a server that fails fails only its own groups."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import channel_layers

import presence.layer
from presence import announce
from presence.hub.groups import Groups
from presence.hub.registry import Registry
from presence.layer import group_calls_of, groups_together
from tests.conftest import on_the_core_layer
from tests.privacy_cases import count_round_trips

pytestmark = on_the_core_layer

USERS = [101, 102, 103, 104, 105]


def group_trips(commands: list[list[str]]) -> list[list[str]]:
    """The round trips of group joins and leaves (not the layer's own receive's): the script
    call, or the layer's own commands."""
    return [trip for trip in commands if set(trip) <= {"EVAL", "ZADD", "EXPIRE", "ZREM"}]


@pytest.fixture
async def groups() -> AsyncIterator[Groups]:
    # A layer of this test's own (the process's is shared with tests on other event loops).
    layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
    joined = Groups(layer, Registry())
    joined.channel = await layer.new_channel()
    yield joined
    await layer.close_pools()


async def members(layer: Any, group: str) -> tuple[list[str], int]:
    """The group's channels and the seconds its key has left, as the layer keeps it."""
    client = layer.connection(layer.consistent_hash(group))
    key = layer._group_key(group)
    return [m.decode() for m in await client.zrange(key, 0, -1)], await client.ttl(key)


async def test_joins_and_leaves_go_in_one_round_trip_per_layer_server(groups: Groups) -> None:
    layer = groups.layer
    assert groups_together(layer)
    servers = {layer.consistent_hash(announce.group_name(uid)) for uid in USERS}
    with count_round_trips() as trips:
        assert await groups.join_users(USERS) == []
    assert len(group_trips(trips.commands)) == len(servers)
    for uid in USERS:
        # As the layer's own group_add leaves it: the channel, scored by the time it joined,
        # in a key that expires group_expiry after the last join.
        group = announce.group_name(uid)
        channels, ttl = await members(layer, group)
        assert channels == [groups.channel]
        assert 0 < ttl <= layer.group_expiry
        client = layer.connection(layer.consistent_hash(group))
        joined_at = await client.zscore(layer._group_key(group), groups.channel)
        assert abs(joined_at - time.time()) < 60
    # Announced to, each group reaches the channel (the layer's own group_send finds it).
    await layer.group_send(announce.group_name(USERS[0]), {"type": "presence.changed"})
    assert (await layer.receive(groups.channel))["type"] == "presence.changed"
    with count_round_trips() as trips:
        assert await groups.leave_users(USERS) == []
    assert len(group_trips(trips.commands)) == len(servers)
    for uid in USERS:
        assert (await members(layer, announce.group_name(uid)))[0] == []


async def test_a_failed_server_fails_its_groups_only(groups: Groups) -> None:
    layer = groups.layer
    names = [announce.group_name(uid) for uid in USERS]
    down = layer.consistent_hash(names[0])
    real = layer.connection

    def connection(index: int) -> Any:
        if index == down:
            raise ConnectionError("the layer's Redis is down")
        return real(index)

    layer.connection = connection
    failures = announce.layer_failures
    try:
        results = await group_calls_of(layer, [("group_add", n, groups.channel) for n in names])
    finally:
        del layer.connection
    failed = [name for name, result in zip(names, results, strict=True) if result is not None]
    assert failed == [name for name in names if layer.consistent_hash(name) == down]
    for name in names:
        assert (await members(layer, name))[0] == ([] if name in failed else [groups.channel])
    # Through the hub's groups, the users whose join failed are kept to be joined again.
    layer.connection = connection
    try:
        assert await groups.join_users(USERS[:1]) == USERS[:1]
    finally:
        del layer.connection
    assert announce.layer_failures > failures


async def test_a_wrapped_layer_gets_its_own_calls(
    groups: Groups, monkeypatch: pytest.MonkeyPatch
) -> None:
    layer = groups.layer
    calls: list[str] = []
    real = layer.group_add

    async def group_add(group: str, channel: str) -> None:
        calls.append(group)
        await real(group, channel)

    monkeypatch.setattr(layer, "group_add", group_add)
    assert not groups_together(layer)
    assert await groups.join_users(USERS[:2]) == []
    assert calls == [announce.group_name(uid) for uid in USERS[:2]]


async def test_the_calls_of_one_moment_go_together(groups: Groups) -> None:
    """Sockets opening together (a reconnect storm: each joins its account's group, and its
    new users') reach the layer in one round trip per layer server, joins and leaves alike."""
    layer = groups.layer
    accounts = ["presence-test-account-1", "presence-test-account-2"]
    left = announce.group_name(USERS[4])
    assert await groups.join_users(USERS[4:]) == []
    everything = [*accounts, *(announce.group_name(uid) for uid in USERS[:4]), left]
    servers = {layer.consistent_hash(group) for group in everything}
    with count_round_trips() as trips:
        await asyncio.gather(
            groups.join(accounts[0]),
            groups.join_users(USERS[:2]),
            groups.join(accounts[1]),
            groups.join_users(USERS[2:4]),
            groups.leave_users(USERS[4:]),
        )
    assert len(group_trips(trips.commands)) == len(servers)
    for group in everything:
        assert (await members(layer, group))[0] == ([] if group == left else [groups.channel])


async def test_a_cancelled_join_reaches_the_layer_before_the_next_call(groups: Groups) -> None:
    """A caller cancelled while its join is on its way: the join still lands, and a leave of
    the same group decided after it goes only once it did (never overtaking it)."""
    layer, group = groups.layer, "presence-test-cancelled"
    joining = asyncio.ensure_future(groups.join(group))
    await asyncio.sleep(0)  # its call asked for, with this moment's others
    turn = groups.joining(group)
    assert turn is not None
    joining.cancel()
    with pytest.raises(asyncio.CancelledError):
        await joining
    assert groups.joining(group) is turn  # held until the join reached the layer
    await asyncio.shield(turn)
    assert (await members(layer, group))[0] == [groups.channel]
    await groups.leave(group)
    assert (await members(layer, group))[0] == []


async def test_a_refused_script_fails_its_calls(groups: Groups) -> None:
    """A server refusing the script (a group's key of another type, written by something
    else) fails the calls sent to it: reported, and joined again at the next sweep."""
    layer = groups.layer
    broken = announce.group_name(USERS[0])
    client = layer.connection(layer.consistent_hash(broken))
    await client.set(layer._group_key(broken), "not a sorted set")
    groups.registry.watchers.add_all(object(), USERS[:2])  # watched: their joins matter
    try:
        failed = await groups.join_users(USERS[:2])
    finally:
        await client.delete(layer._group_key(broken))
    same = layer.consistent_hash(announce.group_name(USERS[1])) == layer.consistent_hash(broken)
    assert failed == (USERS[:2] if same else USERS[:1])
    assert groups.unjoined == set(failed)
    assert await groups.join_users(failed) == []


async def test_a_long_batch_goes_in_short_scripts(
    groups: Groups, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past GROUP_CALLS_AT_ONCE calls to one server, the calls go in several scripts (none
    holding Redis long), still one round trip; a refused script fails its own calls only."""
    layer = groups.layer
    monkeypatch.setattr(presence.layer, "GROUP_CALLS_AT_ONCE", 2)
    names = [announce.group_name(uid) for uid in USERS]
    assert len({layer.consistent_hash(name) for name in names}) == 1  # the tests' one server
    broken = names[2]
    client = layer.connection(layer.consistent_hash(broken))
    await client.set(layer._group_key(broken), "not a sorted set")
    try:
        with count_round_trips() as trips:
            results = await group_calls_of(layer, [("group_add", n, groups.channel) for n in names])
    finally:
        await client.delete(layer._group_key(broken))
    assert group_trips(trips.commands) == [["EVAL", "EVAL", "EVAL"]]
    # The scripts: names[0:2], names[2:4] (refused: broken), names[4:].
    failed = [name for name, result in zip(names, results, strict=True) if result is not None]
    assert failed == names[2:4]
    for name in names:
        assert (await members(layer, name))[0] == ([] if name in failed else [groups.channel])
