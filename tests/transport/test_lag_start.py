"""A lag read says where each partition starts once its oldest messages are gone.

Kafka deletes a partition's oldest records by time (here by ``delete_records``, as retention
does); Redis Streams trims a stream by length (here by ``XTRIM``). Either way the offsets below
the first one held are gone: ``PartitionLag.start`` says where the partition begins, and the
oldest unconsumed timestamp of a group that never committed is that of the first message held.
"""

from __future__ import annotations

from contract.helpers import consume_until, expire_below, make_topic

from pipeline.config import Settings
from pipeline.envelope import TopicPartition
from pipeline.transport.protocol import Transport


async def test_the_lag_read_starts_at_the_first_message_still_held(
    transport: Transport, settings: Settings, unique: str
) -> None:
    """Three of five messages gone: start 3, and a new group's oldest is the fourth's time."""
    topic = f"start_{unique}"
    await make_topic(transport, topic, 1)
    producer = transport.producer()
    for i in range(5):
        await producer.send(topic, b"%d" % i, key=b"k", partition=0)
    await producer.close()
    reader = transport.consumer(f"read-{unique}", [topic])
    sent = await consume_until(reader, lambda r: len(r) >= 5)
    await reader.close()
    admin = transport.admin()
    try:
        (whole,) = await admin.group_lag(f"never-{unique}", topic)
        assert (whole.start, whole.end, whole.oldest_unconsumed_ms) == (0, 5, sent[0].timestamp_ms)
        await expire_below(transport, settings, TopicPartition(topic, 0), 3)
        (trimmed,) = await admin.group_lag(f"never-{unique}", topic)
        assert (trimmed.start, trimmed.end) == (3, 5)
        assert trimmed.oldest_unconsumed_ms == sent[3].timestamp_ms
        await expire_below(transport, settings, TopicPartition(topic, 0), 5)
        (empty,) = await admin.group_lag(f"never-{unique}", topic)
        assert (empty.start, empty.end, empty.oldest_unconsumed_ms) == (5, 5, None)
    finally:
        await admin.delete_group(f"read-{unique}", [topic])
        await admin.delete_topic(topic)
