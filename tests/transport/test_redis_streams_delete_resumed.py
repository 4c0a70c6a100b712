"""A Redis Streams topic deletion that failed half-way is finished by the next one.

``Admin.delete_topic`` removes the topic's metadata first (a read its stream deletion unblocks
must find the topic gone), then each partition's stream, offset counter and committed
positions. Failing after the metadata (Redis gone, a refusal), the next ``delete_topic``
found no topic and raised ``UnknownTopic``, leaving the streams, counters and positions for
good: a topic created again under the name started past offset 0, on the old messages, with the
old group positions.
"""

from __future__ import annotations

import pytest
from runtime.private_redis import bare_client

from pipeline.config import Settings
from pipeline.envelope import Position, TopicPartition
from pipeline.errors import TransportError, UnknownTopic
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig
from pipeline.transport.redis_streams.keys import Keys


def _on(settings: Settings, url: str, prefix: str) -> Settings:
    redis = settings.redis.model_copy(update={"url": url, "key_prefix": prefix})
    return settings.model_copy(update={"redis": redis})


@pytest.mark.parametrize("then", ["delete", "create"])
async def test_a_deletion_cut_short_is_finished_by_the_next_call(
    settings: Settings, unique: str, then: str
) -> None:
    """DEL refused after the metadata went; deleted again (or created again): nothing is left."""
    prefix, topic, group = f"t{unique}", f"cut_{unique}", f"g-{unique}"
    keys = Keys(prefix)
    async with bare_client() as (server, client):
        transport = create_transport(_on(settings, server.url, prefix), "redis")
        admin, producer = transport.admin(), transport.producer()
        await client.acl_setuser(
            "nodel", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-del"]
        )
        refused_url = server.url.replace("redis://", "redis://nodel:pw@")
        refused = create_transport(_on(settings, refused_url, prefix), "redis")
        try:
            await admin.create_topic(TopicConfig(topic, 2))
            for p in (0, 1):
                await producer.send(topic, b"old", partition=p)
            consumer = transport.consumer(group, [topic])
            try:
                got = []
                while len(got) < 2:
                    got += await consumer.poll(10, 0.1)
                await consumer.commit([Position(m.tp, m.offset + 1) for m in got])
            finally:
                await consumer.close()
            with pytest.raises(TransportError, match="delete topic"):
                await refused.admin().delete_topic(topic)
            assert await client.hexists(keys.topics, topic) == 0  # the metadata went first
            if then == "delete":
                await admin.delete_topic(topic)
                with pytest.raises(UnknownTopic):  # done now: nothing left to finish
                    await admin.delete_topic(topic)
            else:
                await admin.create_topic(TopicConfig(topic, 2))
            for p in (0, 1):
                assert await client.exists(keys.stream(topic, p), keys.sequence(topic, p)) == 0
            assert await client.hgetall(keys.positions(group)) == {}
            if then == "create":
                sent = await producer.send(topic, b"new", partition=0)
                assert sent.offset == 0
                lag = await admin.group_lag(group, topic)
                assert [x.committed for x in lag] == [None, None]
                assert lag[0].tp == TopicPartition(topic, 0)
        finally:
            await producer.close()
            await refused.close()
            await transport.close()
