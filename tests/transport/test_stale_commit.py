"""A member's commit for a partition that moved to another member is not recorded.

The runtime computes a commit's positions before it sends them; a rebalance in between gives a
partition to another member, after the revocation committed a later position. The stale commit
that follows must not move the new owner's position back (its messages would run again).
"""

from __future__ import annotations

import asyncio

from contract.helpers import RecordingListener, make_topic, wait_for

from pipeline.envelope import Position, Record, TopicPartition
from pipeline.transport.protocol import Transport


async def test_a_commit_for_a_partition_no_longer_owned_leaves_its_position(
    transport: Transport, unique: str
) -> None:
    """A partition moved with position 8: its former owner's commit of 2 changes nothing."""
    topic, group = f"stale_{unique}", f"g-{unique}"
    await make_topic(transport, topic, 2)
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    producer = transport.producer()
    for tp in tps:
        await producer.send_many(topic, [Record(b"x", partition=tp.partition)] * 10)
    await producer.close()
    first = transport.consumer(
        group, [topic], listener=RecordingListener([Position(tp, 8) for tp in tps])
    )
    second = transport.consumer(group, [topic])
    try:

        async def first_owns_both() -> bool:
            await first.poll(10, 0.2)
            return len(first.assignment()) == 2

        async def shared() -> bool:
            await asyncio.gather(first.poll(10, 0.2), second.poll(10, 0.2))
            return len(first.assignment()) == len(second.assignment()) == 1

        await wait_for(first_owns_both, timeout_s=60)
        await wait_for(shared, timeout_s=60)
        (moved,) = second.assignment()
        assert await second.committed([moved]) == {moved: Position(moved, 8)}

        await first.commit([Position(moved, 2)])

        assert await second.committed([moved]) == {moved: Position(moved, 8)}
    finally:
        await first.close()
        await second.close()
        await transport.admin().delete_group(group, [topic])
