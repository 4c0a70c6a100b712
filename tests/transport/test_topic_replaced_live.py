"""A running member whose topic is deleted and created again reads the new topic from offset 0.

Kafka members take a recreated topic up from its first offset. On Redis Streams, deleting a
topic drops its streams and the group on each, so a member still running met ``NOGROUP`` on
every read for as long as it lived; the in-memory member kept reading the deleted topic's
messages. Both now do as Kafka does, and a topic deleted for good is ``UnknownTopic``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis

from pipeline.config import Settings
from pipeline.envelope import Message, Position, TopicPartition
from pipeline.errors import UnknownTopic
from pipeline.testing import MemoryTransport
from pipeline.transport import create_transport
from pipeline.transport.protocol import Consumer, TopicConfig, Transport
from pipeline.transport.redis_streams.keys import Keys


@dataclass
class Running:
    """A topic of one partition holding three messages, and a member that has read them."""

    transport: Transport
    topic: str
    consumer: Consumer


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


@pytest.fixture(params=["memory", "redis"])
async def running(
    request: pytest.FixtureRequest, settings: Settings, unique: str
) -> AsyncIterator[Running]:
    """The member on each transport; its group and topic are deleted afterwards."""
    if request.param == "memory":
        transport: Transport = MemoryTransport()
    else:
        request.getfixturevalue("redis_service")
        transport = create_transport(settings, "redis")
    topic, group = f"replaced_{unique}", f"g-{unique}"
    admin, producer = transport.admin(), transport.producer()
    await admin.create_topic(TopicConfig(topic, 1))
    for i in range(3):
        await producer.send(topic, b"old-%d" % i, partition=0)
    consumer = transport.consumer(group, [topic])
    try:
        assert len(await _read(consumer, 3)) == 3
        yield Running(transport, topic, consumer)
    finally:
        await consumer.close()
        await admin.delete_group(group, [topic])
        if topic in await admin.list_topics():
            await admin.delete_topic(topic)
        await producer.close()
        await transport.close()


async def test_a_running_member_reads_its_topic_created_again_from_the_start(
    running: Running,
) -> None:
    """Delete and create between two polls: no error, the new messages from offset 0."""
    admin, producer = running.transport.admin(), running.transport.producer()
    await admin.delete_topic(running.topic)
    await admin.create_topic(TopicConfig(running.topic, 1))
    for i in range(2):
        await producer.send(running.topic, b"new-%d" % i, partition=0)

    got = await _read(running.consumer, 2)
    assert [(m.offset, m.value) for m in got] == [(0, b"new-0"), (1, b"new-1")]
    tp = TopicPartition(running.topic, 0)
    assert running.consumer.assignment() == {tp}
    assert await running.consumer.committed([tp]) == {tp: Position(tp, 2)}


async def test_a_running_member_whose_topic_is_deleted_is_told_it_is_unknown(
    running: Running, settings: Settings
) -> None:
    """Deleted and not created again: UnknownTopic, and no stream is made again for it."""
    await running.transport.admin().delete_topic(running.topic)
    with pytest.raises(UnknownTopic):
        await running.consumer.poll(10, 0.1)
    if running.transport.name == "redis":
        client = Redis.from_url(settings.redis.url)
        try:
            assert not await client.exists(Keys(settings.redis.key_prefix).stream(running.topic, 0))
        finally:
            await client.aclose()
