"""The store's async client packs its commands with hiredis (presence.store.connecting): the same
bytes as redis-py's own packer, redis-py's own error for an argument it cannot pack, and a real
round trip through it."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from presence.store import get_store
from presence.store.connecting import hiredis_packing
from tests.conftest import on_one_redis

Packing = hiredis_packing(Connection)


@pytest.mark.parametrize(
    "args",
    [
        ("SET", "key", "value"),
        ("EVALSHA", b"ab12", 2, "k1", "k2", 1.5, 10**20, -3),
        ("ZADD", "z", 1741953600.125, "é, ünïcode"),
        ("CONFIG GET", "maxmemory"),  # a name of two words, sent as two arguments
        (b"CLIENT SETINFO", b"LIB-NAME", "x"),
    ],
)
def test_hiredis_packs_what_redis_py_packs(args: tuple[object, ...]) -> None:
    assert Packing().pack_command(*args) == [b"".join(Connection().pack_command(*args))]


def test_an_argument_hiredis_refuses_gets_redis_pys_own_error() -> None:
    with pytest.raises(DataError):
        Packing().pack_command("SET", "key", True)
    with pytest.raises(DataError):
        Packing().pack_command("SET", "key", None)


def test_packing_classes_are_made_once() -> None:
    assert hiredis_packing(Connection) is Packing
    assert issubclass(Packing, Connection)


@on_one_redis
async def test_the_store_async_client_packs_with_hiredis_and_answers() -> None:
    store = get_store()
    client = store.async_client
    assert client.connection_pool.connection_class is hiredis_packing(Connection)
    try:
        await client.set("presence-test:packing", "é")
        assert await client.get("presence-test:packing") == "é"
    finally:
        await client.delete("presence-test:packing")
        await store.aclose()
