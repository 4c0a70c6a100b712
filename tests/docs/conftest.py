"""Fixtures of the documentation tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis


@pytest.fixture
async def prefix(redis: Redis) -> AsyncIterator[str]:
    """A Redis key prefix of the run's own; every key under it is deleted afterwards."""
    name = f"doc{uuid.uuid4().hex[:10]}"
    yield name
    async for key in redis.scan_iter(match=f"*{name}*", count=1000):
        await redis.delete(key)
