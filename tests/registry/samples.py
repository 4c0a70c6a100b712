"""Sample values the registry's serde tests encode."""

from __future__ import annotations

from datetime import UTC, datetime

from pipeline.registry.client.events import MessageReceivedRecord


def message() -> MessageReceivedRecord:
    """A sample inbound message."""
    return MessageReceivedRecord(
        event_id="evt-1",
        tenant="acme",
        source="meta",
        conversation_id="conv-9",
        text="hello",
        received_at=datetime(2025, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC),
        headers={"x-request-id": "r1"},
    )
