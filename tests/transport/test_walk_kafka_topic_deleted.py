"""A Kafka member whose topic is deleted under it stops with the line a Redis Streams one gives.

Redis Streams said ``topic 'T' does not exist (declare it in topics/ and run `pipeline topics
apply`)``; Kafka said ``consume ['T']: Subscribed topic not available: T: Broker: Unknown topic
or partition (...)``: librdkafka's words twice over and a Python list, the line ``pipeline
consume`` printed as it exited.
"""

from __future__ import annotations

import time

import pytest
from contract.helpers import make_topic
from support import delete_group_after

from pipeline.config import Settings, declare_hint
from pipeline.errors import UnknownTopic
from pipeline.transport.kafka.consumer import KafkaConsumer
from pipeline.transport.kafka.transport import KafkaTransport

pytestmark = pytest.mark.usefixtures("kafka_service")


async def _poll_for(member: KafkaConsumer, seconds: float) -> None:
    """Poll ``member`` for ``seconds`` (returns early only by raising)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await member.poll(10, 0.2)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
async def test_a_member_whose_topic_is_deleted_names_it_in_one_line(
    settings: Settings, unique: str, protocol: str
) -> None:
    """The poll after the deletion raises UnknownTopic naming the topic and the fix.

    Under KIP-848 the broker took the deleted topic's partitions away and said nothing more: the
    member waited for ever, silently, where a classic member fails.
    """
    kafka = settings.kafka.model_copy(update={"group_protocol": protocol})
    transport = KafkaTransport(settings.model_copy(update={"kafka": kafka}))
    topic, group = f"walk_gone_{unique}", f"walk-gone-{unique}"
    await make_topic(transport, topic, 2)
    member = KafkaConsumer(kafka, group, [topic], member_id="m")
    # A static member keeps its slot after close until its session ends: the group is deleted
    # once it has none (at the test's end, or at the session's for a slot still held then).
    delete_group_after(transport, group, [topic])
    admin = transport.admin()
    try:
        deadline = time.monotonic() + 60
        while len(member.assignment()) != 2:
            assert time.monotonic() < deadline, f"owns {member.assignment()} after 60s"
            await member.poll(10, 0.2)
        await admin.delete_topic(topic)
        with pytest.raises(UnknownTopic) as raised:
            await _poll_for(member, 60)
        assert str(raised.value) == f"topic {topic!r} does not exist ({declare_hint()})"
    finally:
        await member.close()
        await admin.close()
