"""Kafka admin details that the transport contract does not cover."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition as RawTP
from confluent_kafka.admin import OffsetSpec
from contract.helpers import make_topic, wait_for

from pipeline.config import Settings
from pipeline.errors import GroupNotEmpty, TransportError
from pipeline.transport import create_transport
from pipeline.transport.protocol import Consumer


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


async def test_a_group_with_a_live_member_is_not_deleted_and_says_why(
    settings: Settings, kafka_service: str, unique: str
) -> None:
    """Deleting a group that still has a member fails with GroupNotEmpty; once it left, it works."""
    transport = create_transport(settings, "kafka")
    admin = transport.admin()
    topic, group = f"busy_{unique}", f"g-{unique}"
    await make_topic(transport, topic, 1)
    consumer = transport.consumer(group, [topic])
    try:
        await wait_for(lambda: _assigned(consumer))
        with pytest.raises(GroupNotEmpty, match=f"{group}.*still has members"):
            await admin.delete_group(group, [topic])
    finally:
        await consumer.close()
    await admin.delete_group(group, [topic])
    listed = admin._raw.list_consumer_groups(request_timeout=10).result().valid  # type: ignore[attr-defined]
    assert group not in {g.group_id for g in listed}
    await transport.close()


async def _assigned(consumer: Consumer) -> bool:
    await consumer.poll(1, 0.2)
    return bool(consumer.assignment())
