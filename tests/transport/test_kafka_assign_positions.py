"""A Kafka member that cannot read a new partition's committed position does not guess it.

The runtime starts tracking an assigned partition from the committed position it is told; told
nothing, it starts at 0, and its next commit of an idle partition would move the group's
position back to 0 (every message after it would run again). A read that fails when the
partitions arrive (the group coordinator moving, a timeout) keeps them paused and unannounced
until the read succeeds.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException
from contract.helpers import RecordingListener, make_topic, wait_for

from pipeline.config import Settings
from pipeline.envelope import Position, Record, TopicPartition
from pipeline.transport import create_transport
from pipeline.transport.kafka.consumer import KafkaConsumer


async def test_a_failed_read_of_committed_positions_is_retried_before_the_partition_is_given(
    settings: Settings, kafka_service: str, unique: str
) -> None:
    """The listener hears of the partition once, at its real position 5; nothing runs before."""
    transport = create_transport(settings, "kafka")
    topic, group = f"assignpos_{unique}", f"g-{unique}"
    tp = TopicPartition(topic, 0)
    await make_topic(transport, topic, 1)
    producer = transport.producer()
    await producer.send_many(topic, [Record(b"m%d" % n, key=b"k") for n in range(8)])
    await producer.close()
    first = transport.consumer(group, [topic])
    try:

        async def first_owns_it() -> bool:
            await first.poll(1, 0.2)
            return first.assignment() == {tp}

        await wait_for(first_owns_it, timeout_s=60)
        await first.commit([Position(tp, 5)])
    finally:
        await first.close()
    listener = RecordingListener()
    consumer = transport.consumer(group, [topic], listener=listener)
    assert isinstance(consumer, KafkaConsumer)
    reads = {"failed": 0}
    real_read = consumer._committed_sync

    def first_read_fails(tps: Any) -> dict[TopicPartition, Position]:
        if not reads["failed"]:
            reads["failed"] += 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return real_read(tps)

    consumer._committed_sync = first_read_fails  # type: ignore[method-assign]
    got: list[int] = []
    try:

        async def three_arrived() -> bool:
            batch = await consumer.poll(10, 0.2)
            assert not batch or listener.assigned == [tp], "delivered before it was given out"
            got.extend(m.offset for m in batch)
            return len(got) >= 3

        await wait_for(three_arrived, timeout_s=60)
        assert reads["failed"] == 1
        assert (listener.assigned, listener.committed) == ([tp], {tp: Position(tp, 5)})
        assert got == [5, 6, 7]
    finally:
        await consumer.close()
        await transport.admin().delete_group(group, [topic])
        await transport.close()
