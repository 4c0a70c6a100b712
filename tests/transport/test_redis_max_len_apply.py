"""A Redis Streams topic's ``max_len`` raised in its declaration reaches the broker and producers.

The runbook for messages lost to retention tells the operator to raise ``max_len`` and run
``pipeline topics apply``; that alone must change the stored length, and producers already
running must then trim at the new length (they re-read a topic's metadata every few seconds).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from contract.helpers import wait_for
from support import delete_after_test

from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport
from pipeline.transport.redis_streams.admin import read_meta
from pipeline.transport.redis_streams.keys import Keys
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

pytestmark = pytest.mark.usefixtures("redis_service")


@pytest.fixture
async def streams(settings: Settings) -> AsyncIterator[RedisStreamsTransport]:
    """The Redis Streams transport of the test settings."""
    transport = create_transport(settings, "redis")
    assert isinstance(transport, RedisStreamsTransport)
    yield transport
    await transport.close()


def declared(name: str, max_len: int) -> TopicSpec:
    """A one-partition declaration of ``name`` keeping ``max_len`` entries per stream."""
    return TopicSpec.model_validate({"name": name, "partitions": 1, "max_len": max_len})


async def test_apply_raises_the_stored_max_len_of_an_existing_topic(
    streams: RedisStreamsTransport, settings: Settings, unique: str
) -> None:
    """Raising only ``max_len`` plans an update of each topic, and applying stores the length."""
    name = f"maxlen_{unique}"
    delete_after_test(streams, declared(name, 100).topic_names())
    admin = streams.admin()
    await apply(admin, [declared(name, 100)], settings.redis.max_len, dry_run=False)

    actions = await apply(admin, [declared(name, 1000)], settings.redis.max_len, dry_run=False)

    assert [str(a) for a in actions] == [
        f"update_configs {name} (max_len 100 -> 1000)",
        f"update_configs {name}.dlq (max_len 100 -> 1000)",
    ]
    meta = await read_meta(
        streams.client, Keys(settings.redis.key_prefix), name, settings.redis.max_len
    )
    assert meta.max_len == 1000
    listed = await admin.list_topics([name])
    assert listed[name].max_len == 1000
    again = await apply(admin, [declared(name, 1000)], settings.redis.max_len, dry_run=True)
    assert again == []


async def test_a_running_producer_trims_at_the_raised_max_len(
    streams: RedisStreamsTransport, settings: Settings, unique: str
) -> None:
    """A producer that cached the old length keeps more entries once the raise is applied."""
    name = f"maxlen_{unique}"
    delete_after_test(streams, declared(name, 100).topic_names())
    admin = streams.admin()
    await apply(admin, [declared(name, 100)], settings.redis.max_len, dry_run=False)
    producer = streams.producer()
    stream = Keys(settings.redis.key_prefix).stream(name, 0)
    try:
        for _ in range(300):
            await producer.send(name, b"x")
        assert await streams.client.xlen(stream) < 300  # trimmed at about 100

        await apply(admin, [declared(name, 1000)], settings.redis.max_len, dry_run=False)

        async def keeps_more() -> bool:
            await producer.send_many(name, [Record(b"x") for _ in range(50)])
            return int(await streams.client.xlen(stream)) > 500

        await wait_for(keeps_more, timeout_s=60)
    finally:
        await producer.close()
