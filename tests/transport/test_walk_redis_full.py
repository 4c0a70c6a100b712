"""A Redis Streams broker at ``maxmemory`` (noeviction) is named as full, with what to do.

Redis refuses every write then: ``pl_produce``, and a member's ``pl_heartbeat``, so members
cannot even join. The lines were Redis's own, ``produce to 'T': command not allowed when used
memory > 'maxmemory'.`` and ``consume ['T']: command not allowed ...`` every few seconds, which
named neither the server nor what to do. A private redis-server: the shared one's configuration
is never touched.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from contract.helpers import make_topic
from ingress.redis_server import require_redis_server, start_redis

from pipeline.config import Settings
from pipeline.errors import TransportError
from pipeline.testing.ports import free_port
from pipeline.transport.protocol import Producer
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

FULL = "Redis is full (used memory above its maxmemory, noeviction): it refuses writes"


async def _fill(producer: Producer) -> None:
    """Send 4 KiB messages until Redis refuses one (at most 4 MiB of them)."""
    for i in range(1000):
        await producer.send("full", b"x" * 4096 + b"%d" % i, partition=0)


@pytest.fixture
def full_redis() -> Iterator[int]:
    """A private redis-server of 1 MiB that refuses writes once full; stopped afterwards."""
    require_redis_server()
    port = free_port()
    process = start_redis(
        port, "--maxmemory", "1mb", "--maxmemory-policy", "noeviction", "--save", ""
    )
    try:
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


async def test_a_full_redis_is_named_with_what_to_do(settings: Settings, full_redis: int) -> None:
    """Producing into a full Redis and polling a member of it say so in one line each."""
    redis = settings.redis.model_copy(update={"url": f"redis://127.0.0.1:{full_redis}/0"})
    transport = RedisStreamsTransport(settings.model_copy(update={"redis": redis}))
    await make_topic(transport, "full", 1)
    producer = transport.producer()
    with pytest.raises(TransportError) as refused:
        await _fill(producer)
    await producer.close()
    text = str(refused.value)
    assert text.startswith(f"produce to 'full': {FULL}")
    assert "\n" not in text
    assert "maxmemory" in text.split(FULL)[1]
    member = transport.consumer("g", ["full"])
    try:
        with pytest.raises(TransportError) as polled:
            await member.poll(10, 0.2)
        assert f"{FULL}" in str(polled.value)
    finally:
        await member.close()
        await transport.close()
