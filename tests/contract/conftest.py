"""The contract suite's transports: both real brokers and the in-memory one of pipeline.testing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pipeline.config import Settings
from pipeline.testing import MemoryBroker, MemoryTransport
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport

SESSION_TIMEOUT_MS = 1500
"""The in-memory broker's session timeout here: the Redis lease of the test settings."""


@pytest.fixture(params=["kafka", "redis", "memory"])
async def transport(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[Transport]:
    """Each transport in turn: Kafka and Redis on their real brokers, and the in-memory one."""
    if request.param == "memory":
        t: Transport = MemoryTransport(
            MemoryBroker(session_timeout_ms=SESSION_TIMEOUT_MS),
            max_message_bytes=settings.max_message_bytes,
        )
    else:
        request.getfixturevalue(f"{request.param}_service")
        t = create_transport(settings, request.param)
    yield t
    await t.close()
