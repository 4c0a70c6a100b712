"""A cancellation calls its Redis function; it does not load the library again each time.

Every ``pipeline.cancel.cancel`` (``app.cancel`` from a handler or a web app) built a new
binding of the library and sent ``FUNCTION LOAD REPLACE``: Redis compiled the whole library
again for each cancellation (about 0.7 ms, during which it serves no other client) and wrote it
to its append-only file and its replicas.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ingress.redis_server import command_calls, private_client
from redis.asyncio import Redis

from pipeline.cancel import cancel
from pipeline.cancel.target import Target

CANCELS = 20


@pytest.fixture
async def private(tmp_path: Path) -> AsyncIterator[Redis]:
    """A client of a redis-server of this test's own: its command counts are the test's alone."""
    async with private_client(tmp_path / "redis") as client:
        yield client


async def test_many_cancellations_load_the_library_once(private: Redis) -> None:
    """Twenty cancellations through one client: one FUNCTION LOAD, twenty cancellations."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    for n in range(CANCELS):
        await cancel(private, prefix, Target.of(key=f"conversation-{n}"))
    assert await command_calls(private, "function|load") == 1


async def test_a_library_redis_lost_is_loaded_again(private: Redis) -> None:
    """After FUNCTION FLUSH (a Redis restarted without persistence) the next cancel still works."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    await cancel(private, prefix, Target.of(key="first"))
    await private.function_flush()
    await cancel(private, prefix, Target.of(key="second"))
    assert await command_calls(private, "function|load") == 2
