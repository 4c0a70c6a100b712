"""A running Redis Streams member facing topic metadata it cannot read.

The topics hash is plain Redis: a hand edit or another program may leave a topic's value
malformed. The member's heartbeat must go on renewing its leases and keep the partitions it
knew, saying once (then ever more rarely) which topic and field are wrong.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from contract.helpers import wait_for
from redis.asyncio import Redis
from support import delete_after_test

from pipeline.config import Settings
from pipeline.envelope import TopicPartition
from pipeline.transport.protocol import TopicConfig
from pipeline.transport.redis_streams.consumer import RedisStreamsConsumer
from pipeline.transport.redis_streams.keys import Keys
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

pytestmark = pytest.mark.usefixtures("redis_service")


@pytest.fixture
async def transport(settings: Settings, unique: str) -> AsyncIterator[RedisStreamsTransport]:
    """A Redis Streams transport whose members renew often, so the test waits little.

    Under a key prefix of its own (deleted by ``unique``): a broken entry in the shared topics
    hash made every concurrent test's ``pipeline topics apply`` (its ``list_topics``) fail.
    """
    redis = settings.redis.model_copy(
        update={"heartbeat_ms": 20, "lease_ms": 60_000, "key_prefix": f"bm{unique}"}
    )
    t = RedisStreamsTransport(settings.model_copy(update={"redis": redis}))
    yield t
    await t.close()


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ('{"partitions": "two"}', "partitions"),
        ('{"max_len": 5}', "partitions"),
        ('{"partitions": 0}', "partitions"),
        ('{"partitions": true}', "partitions"),
        ("[2]", "JSON object"),
        ("not json", "not JSON"),
    ],
)
async def test_malformed_topic_metadata_keeps_the_heartbeat_and_the_partitions(
    transport: RedisStreamsTransport,
    redis: Redis,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    value: str,
    field: str,
) -> None:
    """Malformed metadata is one warning naming the topic and field; the heartbeat lives on."""
    topic, group = f"badmeta-{unique}", f"g-{unique}"
    delete_after_test(transport, [topic])
    await transport.admin().create_topic(TopicConfig(topic, 2))
    consumer = transport.consumer(group, [topic])
    assert isinstance(consumer, RedisStreamsConsumer)
    keys = Keys(transport._settings.redis.key_prefix)
    good = await redis.hget(keys.topics, topic)
    assert good is not None
    try:
        await wait_for(lambda: _owns(consumer, topic, 2), timeout_s=30)
        caplog.set_level(logging.WARNING, "pipeline.transport.redis_streams.consumer")
        await redis.hset(keys.topics, topic, value)

        async def warned() -> bool:
            return any(topic in r.getMessage() for r in caplog.records)

        await wait_for(warned, timeout_s=30)
        line = next(r.getMessage() for r in caplog.records if topic in r.getMessage())
        assert field in line
        assert "\n" not in line
        assert consumer._heartbeat_task is not None
        assert not consumer._heartbeat_task.done()
        assert consumer.assignment() == {TopicPartition(topic, p) for p in range(2)}

        await redis.hset(keys.topics, topic, good.replace(b'"partitions": 2', b'"partitions": 3'))
        await wait_for(lambda: _owns(consumer, topic, 3), timeout_s=30)
    finally:
        await redis.hset(keys.topics, topic, good)  # readable, so deleted after the test
        await consumer.close()
        await transport.admin().delete_group(group, [topic])


async def _owns(consumer: RedisStreamsConsumer, topic: str, partitions: int) -> bool:
    """Whether, after a short poll, ``consumer`` owns the first ``partitions`` of ``topic``."""
    await consumer.poll(10, 0.05)
    return consumer.assignment() == {TopicPartition(topic, p) for p in range(partitions)}
