"""The contract suites against the in-memory doubles of pipeline.testing, so they cannot drift."""

from __future__ import annotations

from contract.base.transport import TransportContract


class TestMemoryTransport(TransportContract):
    """MemoryTransport passes the transport contract."""

    kind = "memory"
