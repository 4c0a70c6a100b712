"""Fixtures of the capacity tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis


@pytest.fixture
async def prefix(redis: Redis, unique: str) -> AsyncIterator[str]:
    """A key prefix of this test's own; its keys are deleted afterwards."""
    name = f"t{unique}"
    yield name
    found = [key async for key in redis.scan_iter(match=f"{{{name}:cap:*")]
    if found:
        await redis.delete(*found)
