"""A topic deleted and created again starts without the old topic's committed positions.

Kafka forgets the offsets groups committed on a topic when the topic is deleted. A group that
kept them would take the new topic's first messages (whose offsets start at 0 again) for ones it
had already done: the runtime skips offsets below the committed position.
"""

from __future__ import annotations

from contract.helpers import consume_until, make_topic

from pipeline.envelope import TopicPartition
from pipeline.transport.protocol import TopicConfig, Transport


async def test_a_recreated_topic_has_no_committed_positions_of_the_deleted_one(
    transport: Transport, unique: str
) -> None:
    """After delete and create, the group has no position there and its lag is the new messages."""
    topic, group = f"recreated_{unique}", f"g-{unique}"
    tp = TopicPartition(topic, 0)
    await make_topic(transport, topic, 1)
    admin = transport.admin()
    try:
        producer = transport.producer()
        for i in range(5):
            await producer.send(topic, b"old-%d" % i, partition=0)
        reader = transport.consumer(group, [topic])
        await consume_until(reader, lambda r: len(r) >= 5)
        await reader.close()
        (before,) = await admin.group_lag(group, topic)
        assert before.committed == 5

        await admin.delete_topic(topic)
        await admin.create_topic(TopicConfig(topic, 1))
        for i in range(3):
            await producer.send(topic, b"new-%d" % i, partition=0)
        await producer.close()

        (after,) = await admin.group_lag(group, topic)
        assert (after.committed, after.end, after.lag) == (None, 3, 3)
        successor = transport.consumer(group, [topic])
        assert await successor.committed([tp]) == {}
        got = await consume_until(successor, lambda r: len(r) >= 3)
        await successor.close()
        assert [m.value for m in got] == [b"new-0", b"new-1", b"new-2"]
    finally:
        await admin.delete_group(group, [topic])
