"""A cancellation calls its Redis function; it does not load the library again each time.

Every ``pipeline.cancel.cancel`` (``app.cancel`` from a handler or a web app) built a new
binding of the library and sent ``FUNCTION LOAD REPLACE``: Redis compiled the whole library
again for each cancellation (about 0.7 ms, during which it serves no other client) and wrote it
to its append-only file and its replicas.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ingress.redis_server import RedisServer
from redis.asyncio import Redis

from pipeline.cancel import cancel
from pipeline.cancel.target import Target

CANCELS = 20


@pytest.fixture
async def private(tmp_path: Path) -> AsyncIterator[Redis]:
    """A client of a redis-server of this test's own: its command counts are the test's alone."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed; run `make services`")
    server = RedisServer(tmp_path / "redis")
    server.start()
    client = Redis.from_url(server.url)
    try:
        yield client
    finally:
        await client.aclose()
        server.stop()


async def _loads(client: Redis) -> int:
    """How many FUNCTION LOAD calls the server has run."""
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_function|load", {}).get("calls", 0))


async def test_many_cancellations_load_the_library_once(private: Redis) -> None:
    """Twenty cancellations through one client: one FUNCTION LOAD, twenty cancellations."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    for n in range(CANCELS):
        await cancel(private, prefix, Target.of(key=f"conversation-{n}"))
    assert await _loads(private) == 1


async def test_a_library_redis_lost_is_loaded_again(private: Redis) -> None:
    """After FUNCTION FLUSH (a Redis restarted without persistence) the next cancel still works."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    await cancel(private, prefix, Target.of(key="first"))
    await private.function_flush()
    await cancel(private, prefix, Target.of(key="second"))
    assert await _loads(private) == 2
