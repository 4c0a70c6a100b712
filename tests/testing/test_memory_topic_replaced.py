"""An in-memory member whose topic is deleted and created again reads the new topic.

Kafka members take a recreated topic up from its first offset; the in-memory member must not
keep reading the deleted topic's messages (or wait on them) instead.
"""

from __future__ import annotations

from pipeline.envelope import Message, Position, TopicPartition
from pipeline.testing import MemoryTransport
from pipeline.transport.protocol import Consumer, TopicConfig


async def _read(consumer: Consumer, n: int) -> list[Message]:
    """Poll (committing) until ``n`` messages came, or until polls bring nothing more."""
    got: list[Message] = []
    for _ in range(20):
        batch = await consumer.poll(100, 0.05)
        got += batch
        if batch:
            last = batch[-1]
            await consumer.commit([Position(last.tp, last.offset + 1)])
        if len(got) >= n:
            break
    return got


async def test_a_running_member_reads_its_topic_created_again_from_the_start() -> None:
    """Delete and create between two polls: the member reads the new messages from offset 0."""
    transport = MemoryTransport()
    admin, producer = transport.admin(), transport.producer()
    await admin.create_topic(TopicConfig("orders", 1))
    for i in range(3):
        await producer.send("orders", b"old-%d" % i, partition=0)
    consumer = transport.consumer("g", ["orders"])
    assert len(await _read(consumer, 3)) == 3

    await admin.delete_topic("orders")
    await admin.create_topic(TopicConfig("orders", 1))
    for i in range(2):
        await producer.send("orders", b"new-%d" % i, partition=0)

    got = await _read(consumer, 2)
    assert [(m.offset, m.value) for m in got] == [(0, b"new-0"), (1, b"new-1")]
    assert consumer.assignment() == {TopicPartition("orders", 0)}
    assert await consumer.committed([TopicPartition("orders", 0)]) == {
        TopicPartition("orders", 0): Position(TopicPartition("orders", 0), 2)
    }
    await consumer.close()
