"""The store's clients, sync and async, pack their commands with hiredis
(presence.store.connecting): the same bytes as redis-py's own packer, one command or a
pipeline's, redis-py's own error for an argument it cannot pack, and a real round trip through
each."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection as AsyncConnection
from redis.connection import Connection as SyncConnection
from redis.exceptions import DataError

from presence.store import get_store
from presence.store.connecting import hiredis_packing
from tests.conftest import on_one_redis

CONNECTIONS = [SyncConnection, AsyncConnection]
COMMANDS = [
    ("SET", "key", "value"),
    ("EVALSHA", b"ab12", 2, "k1", "k2", 1.5, 10**20, -3),
    ("ZADD", "z", 1741953600.125, "é, ünïcode"),
    ("CONFIG GET", "maxmemory"),  # a name of two words, sent as two arguments
    (b"CLIENT SETINFO", b"LIB-NAME", "x"),
]


@pytest.mark.parametrize("connection", CONNECTIONS)
@pytest.mark.parametrize("args", COMMANDS)
def test_hiredis_packs_what_redis_py_packs(connection: Any, args: tuple[object, ...]) -> None:
    packing = hiredis_packing(connection)
    assert packing().pack_command(*args) == [b"".join(connection().pack_command(*args))]


@pytest.mark.parametrize("connection", CONNECTIONS)
def test_hiredis_packs_a_pipeline_as_redis_py_does(connection: Any) -> None:
    packing = hiredis_packing(connection)
    assert packing().pack_commands(COMMANDS) == [b"".join(connection().pack_commands(COMMANDS))]


@pytest.mark.parametrize("connection", CONNECTIONS)
def test_an_argument_hiredis_refuses_gets_redis_pys_own_error(connection: Any) -> None:
    packing = hiredis_packing(connection)
    for bad in (True, None):
        with pytest.raises(DataError):
            packing().pack_command("SET", "key", bad)
        with pytest.raises(DataError):
            packing().pack_commands([("GET", "a"), ("SET", "key", bad)])


@pytest.mark.parametrize("connection", CONNECTIONS)
def test_packing_classes_are_made_once(connection: Any) -> None:
    assert hiredis_packing(connection) is hiredis_packing(connection)
    assert issubclass(hiredis_packing(connection), connection)


@on_one_redis
def test_the_store_sync_client_packs_with_hiredis_and_answers() -> None:
    store = get_store()
    client = store.client
    assert client.connection_pool.connection_class is hiredis_packing(SyncConnection)
    try:
        client.set("presence-test:packing", "é")
        assert client.get("presence-test:packing") == "é"
        pipe = client.pipeline(transaction=False)
        pipe.set("presence-test:packing", "ü").get("presence-test:packing")
        assert pipe.execute() == [True, "ü"]
    finally:
        client.delete("presence-test:packing")


@on_one_redis
def test_a_single_command_of_the_sync_client_is_packed_by_hiredis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """redis-py's sync ``send_command`` packs with a packer of its own, not ``pack_command``:
    a command sent alone (a room's join) must still be packed in C."""
    packed: list[tuple[object, ...]] = []
    packing = hiredis_packing(SyncConnection)
    original = packing.pack_command

    def spy(self: Any, *args: Any) -> list[bytes]:
        packed.append(args)
        return original(self, *args)

    monkeypatch.setattr(packing, "pack_command", spy)
    client = get_store().client
    assert client.echo("é") == "é"
    assert ("ECHO", "é") in packed


@on_one_redis
async def test_the_store_async_client_packs_with_hiredis_and_answers() -> None:
    store = get_store()
    client = store.async_client
    assert client.connection_pool.connection_class is hiredis_packing(AsyncConnection)
    try:
        await client.set("presence-test:packing", "é")
        assert await client.get("presence-test:packing") == "é"
    finally:
        await client.delete("presence-test:packing")
        await store.aclose()
