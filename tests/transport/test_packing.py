"""Packing in one pass (hiredis) writes exactly the bytes redis-py writes, and Redis takes them."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from pipeline.config import Settings
from pipeline.transport.redis_streams.packing import OnePassConnection, pack_in_one_pass
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

COMMANDS: list[tuple[Any, ...]] = [
    ("FCALL", "pl_produce", 2, "s", "q", 20_000, 1, 4, "k", b"key", "v", b"x" * 7_000),
    ("SET", "k", "é", "EX", 10),
    ("CONFIG GET", "maxmemory"),  # a name with a space: redis-py's own path
    ("XADD", b"k", 1.5, 3),  # a float, written as repr() writes it
    ("GET", memoryview(b"ab")),
    ("ECHO", b""),
]


@pytest.mark.parametrize("args", COMMANDS)
def test_same_bytes_as_redis_py(args: tuple[Any, ...]) -> None:
    """Every command packs to the bytes of redis-py's ``pack_command``."""
    ours = b"".join(bytes(p) for p in OnePassConnection().pack_command(*args))
    theirs = b"".join(bytes(p) for p in Connection().pack_command(*args))
    assert ours == theirs


def test_booleans_are_still_refused() -> None:
    """A bool is not silently sent as an int: redis-py's DataError, as before."""
    from redis.exceptions import DataError  # noqa: PLC0415

    with pytest.raises(DataError):
        OnePassConnection().pack_command("SET", "k", True)  # noqa: FBT003 - the value refused


def test_only_plain_tcp_pools_change() -> None:
    """``rediss://`` and unix-socket pools keep their own connection class."""
    tcp = Redis.from_url("redis://127.0.0.1:1")
    tls = Redis.from_url("rediss://127.0.0.1:1")
    unix = Redis.from_url("unix:///tmp/none.sock")
    for client in (tcp, tls, unix):
        pack_in_one_pass(client.connection_pool)
    assert tcp.connection_pool.connection_class is OnePassConnection
    assert tls.connection_pool.connection_class is not OnePassConnection
    assert unix.connection_pool.connection_class is not OnePassConnection


async def test_transport_round_trip(settings: Settings, redis_service: str, unique: str) -> None:
    """The transport's client uses it, and Redis answers commands packed by it."""
    transport = RedisStreamsTransport(settings)
    try:
        assert transport.client.connection_pool.connection_class is OnePassConnection
        key = f"pl-test-packing-{unique}"
        await transport.client.set(key, "é" * 3_000, ex=30)
        assert (await transport.client.get(key)) == ("é" * 3_000).encode()
        await transport.client.delete(key)
    finally:
        await transport.close()
