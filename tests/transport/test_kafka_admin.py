"""Kafka admin details that the transport contract does not cover."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition as RawTP
from confluent_kafka.admin import OffsetSpec

from pipeline.config import Settings
from pipeline.errors import TransportError
from pipeline.transport import create_transport


async def test_offsets_of_a_topic_deleted_meanwhile_are_skipped_only_when_asked(
    settings: Settings, kafka_service: str, unique: str
) -> None:
    """Listing topics tolerates a topic that vanished after the metadata was read."""
    transport = create_transport(settings, "kafka")
    admin = transport.admin()
    gone = [RawTP(f"gone_{unique}", 0)]
    try:
        assert await admin._offsets(gone, OffsetSpec.latest(), skip_gone=True) == {}  # type: ignore[attr-defined]
        with pytest.raises(TransportError):
            await admin._offsets(gone, OffsetSpec.latest())  # type: ignore[attr-defined]
    finally:
        await transport.close()
