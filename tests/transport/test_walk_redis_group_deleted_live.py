"""Deleting a Redis Streams group while a member reads it is refused, as Kafka refuses it.

``Admin.delete_group`` forgets a group that has no members. On Redis Streams it destroyed the
stream groups and the positions under a running member: its next read found ``NOGROUP``, it
took its partitions up again from offset 0, and every message the group had handled ran again
(2,646 extra runs of 2,200 messages, in a walk through docs/transports.md), with a warning
that another member had taken its partitions over. Both transports now raise GroupNotEmpty.
"""

from __future__ import annotations

import time

import pytest
from contract.helpers import make_topic

from pipeline.config import Settings
from pipeline.envelope import Position, TopicPartition
from pipeline.errors import GroupNotEmpty
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

pytestmark = pytest.mark.usefixtures("redis_service")


async def test_a_group_with_a_live_member_is_not_deleted(settings: Settings, unique: str) -> None:
    """GroupNotEmpty while the member runs, its position kept; deleted once it has left."""
    transport = RedisStreamsTransport(settings)
    topic, group = f"walk_gdel_{unique}", f"walk-gdel-{unique}"
    await make_topic(transport, topic, 1)
    admin = transport.admin()
    producer = transport.producer()
    for i in range(3):
        await producer.send(topic, b"%d" % i, partition=0)
    await producer.close()
    member = transport.consumer(group, [topic])
    try:
        got: list[object] = []
        deadline = time.monotonic() + 60
        while len(got) < 3:
            assert time.monotonic() < deadline, f"read {len(got)} of 3 in 60s"
            got += await member.poll(10, 0.2)
        await member.commit([Position(TopicPartition(topic, 0), 3)])
        with pytest.raises(GroupNotEmpty) as refused:
            await admin.delete_group(group, [topic])
        assert str(refused.value).startswith(f"delete group {group!r}: it still has members")
        assert (await admin.group_lag(group, topic))[0].committed == 3
        assert await member.poll(10, 0.2) == []  # its stream group is still there
    finally:
        await member.close()
    await admin.delete_group(group, [topic])
    (lag,) = await admin.group_lag(group, topic)
    assert lag.committed is None
    await admin.delete_topic(topic)
    await transport.close()
