"""The contract suites' fixtures: each test class names its implementation in ``kind``.

Transports: both real brokers and the in-memory one of pipeline.testing. The stores' fixtures
are methods of their base classes (``base/logstore.py``, ``base/registry_store.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from registry.stores import pg_stores  # noqa: F401 - the PostgreSQL registry stores' fixture

from pipeline.config import Settings
from pipeline.testing import MemoryBroker, MemoryTransport
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport

SESSION_TIMEOUT_MS = 1500
"""The in-memory broker's session timeout here: the Redis lease of the test settings."""


@pytest.fixture
async def transport(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[Transport]:
    """The test class's transport (``kind``): Kafka or Redis on its real broker, or in memory."""
    kind = request.cls.kind
    if kind == "memory":
        t: Transport = MemoryTransport(
            MemoryBroker(session_timeout_ms=SESSION_TIMEOUT_MS),
            max_message_bytes=settings.max_message_bytes,
        )
    else:
        request.getfixturevalue(f"{kind}_service")
        t = create_transport(settings, kind)
    yield t
    await t.close()
