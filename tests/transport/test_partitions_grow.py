"""Partitions added to a topic while its group runs are taken up by the running members.

The documented way to scale a lane past its partition count is to raise ``partitions:`` and run
``pipeline topics apply`` while the members run; the producers send keys to the new partitions
at once, so the members must read them without a restart.
"""

from __future__ import annotations

from contract.helpers import consume_until, make_topic, wait_for

from pipeline.envelope import TopicPartition
from pipeline.transport.protocol import TopicConfig, Transport


async def test_a_running_member_reads_partitions_added_to_its_topic(
    transport: Transport, unique: str
) -> None:
    """A member of a one-partition topic grown to three is assigned and reads all three."""
    topic = f"grow_{unique}"
    await make_topic(transport, topic, 1)
    consumer = transport.consumer(f"g-{unique}", [topic])
    try:

        async def owns_one() -> bool:
            await consumer.poll(10, 0.2)
            return consumer.assignment() == {TopicPartition(topic, 0)}

        await wait_for(owns_one, timeout_s=60)
        await transport.admin().update_topic(TopicConfig(topic, 3))
        producer = transport.producer()
        for p in range(3):
            await producer.send(topic, b"%d" % p, partition=p)
        await producer.close()
        got = await consume_until(consumer, lambda r: len(r) >= 3)
        assert sorted((m.partition, m.value) for m in got) == [(0, b"0"), (1, b"1"), (2, b"2")]
        assert consumer.assignment() == {TopicPartition(topic, p) for p in range(3)}
    finally:
        await consumer.close()
        await transport.admin().delete_group(f"g-{unique}", [topic])
