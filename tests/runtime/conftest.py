"""Fixtures the runtime suites share: a key prefix and lanes of the test's own, removed after."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from runtime.owned import Declare, owned_lanes

from pipeline.cancel.keys import CancelKeys
from pipeline.transport.protocol import Transport


@pytest.fixture
async def prefix(redis: Redis, unique: str) -> AsyncIterator[str]:
    """A key prefix of the test's own; its cancellation and guard keys are deleted after."""
    name = f"t{unique}"
    yield name
    left = [k async for k in redis.scan_iter(f"{{{name}:*")]
    await redis.delete(*CancelKeys(name).all(), *left)


@pytest.fixture
async def lanes(transport: Transport, unique: str) -> AsyncIterator[Declare]:
    """Declare lanes for the test; their topics and its group are deleted after."""
    async for declare_owned in owned_lanes(transport, f"g-{unique}"):
        yield declare_owned
