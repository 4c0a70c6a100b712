"""A Redis Streams member whose topic is deleted and created again reads the new topic.

Deleting a topic drops its streams and, with them, the group on each; a member still running
would fail every read with ``NOGROUP`` for as long as it lives. As a Kafka member (and the
in-memory one) does, it takes the new topic up from its first offset.
"""

from __future__ import annotations

import pytest
from contract.helpers import make_topic
from redis.asyncio import Redis

from pipeline.config import Settings
from pipeline.envelope import Message, Position, TopicPartition
from pipeline.errors import UnknownTopic
from pipeline.transport import create_transport
from pipeline.transport.protocol import Consumer, TopicConfig
from pipeline.transport.redis_streams.keys import Keys


async def _read(consumer: Consumer, n: int) -> list[Message]:
    """Poll (committing) until ``n`` messages came or 40 polls passed."""
    got: list[Message] = []
    for _ in range(40):
        batch = await consumer.poll(100, 0.1)
        got += batch
        if batch:
            last = batch[-1]
            await consumer.commit([Position(last.tp, last.offset + 1)])
        if len(got) >= n:
            break
    return got


async def test_a_running_member_reads_its_topic_created_again_from_the_start(
    settings: Settings, redis_service: str, unique: str
) -> None:
    """Delete and create between two polls: no error, the new messages from offset 0."""
    transport = create_transport(settings, "redis")
    topic, group = f"replaced_{unique}", f"g-{unique}"
    admin, producer = transport.admin(), transport.producer()
    await make_topic(transport, topic, 1)
    for i in range(3):
        await producer.send(topic, b"old-%d" % i, partition=0)
    consumer = transport.consumer(group, [topic])
    try:
        assert len(await _read(consumer, 3)) == 3

        await admin.delete_topic(topic)
        await admin.create_topic(TopicConfig(topic, 1))
        for i in range(2):
            await producer.send(topic, b"new-%d" % i, partition=0)

        got = await _read(consumer, 2)
        assert [(m.offset, m.value) for m in got] == [(0, b"new-0"), (1, b"new-1")]
        tp = TopicPartition(topic, 0)
        assert await consumer.committed([tp]) == {tp: Position(tp, 2)}
    finally:
        await consumer.close()
        await admin.delete_group(group, [topic])
        await producer.close()
        await transport.close()


async def test_a_running_member_whose_topic_is_deleted_is_told_it_is_unknown(
    settings: Settings, redis_service: str, unique: str
) -> None:
    """Deleted and not created again: UnknownTopic, and no stream is made again for it."""
    transport = create_transport(settings, "redis")
    topic, group = f"deleted_{unique}", f"g-{unique}"
    admin, producer = transport.admin(), transport.producer()
    await make_topic(transport, topic, 1)
    await producer.send(topic, b"only", partition=0)
    consumer = transport.consumer(group, [topic])
    try:
        assert len(await _read(consumer, 1)) == 1
        await admin.delete_topic(topic)
        with pytest.raises(UnknownTopic):
            await consumer.poll(10, 0.1)
        client = Redis.from_url(settings.redis.url)
        try:
            stream = Keys(settings.redis.key_prefix).stream(topic, 0)
            assert not await client.exists(stream)
        finally:
            await client.aclose()
    finally:
        await consumer.close()
        await admin.delete_group(group, [topic])
        await producer.close()
        await transport.close()
