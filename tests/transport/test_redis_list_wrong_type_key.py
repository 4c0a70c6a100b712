"""One Redis topic's partition key of another type must not fail the listing of every topic.

`pipeline topics apply` lists every topic on the broker first: a stream key another program
overwrote with a string failed that listing (WRONGTYPE), so no topic of the deployment could be
created or updated until the key was found and deleted; `pipeline topics list` showed nothing.
"""

from __future__ import annotations

import logging

import pytest
from redis.asyncio import Redis

from pipeline.config import Settings
from pipeline.transport.protocol import TopicConfig, Transport


async def test_a_wrong_type_key_lists_its_partition_as_empty_and_the_others_go_on(
    streams: Transport,
    redis: Redis,
    settings: Settings,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The broken partition counts 0, one warning names its key; the other topic is listed."""
    broken, healthy = f"lwt_{unique}", f"lwtok_{unique}"
    admin = streams.admin()
    await admin.create_topic(TopicConfig(broken, 2))
    await admin.create_topic(TopicConfig(healthy, 1))
    key = f"{{{settings.redis.key_prefix}:{broken}:1}}:s"
    try:
        producer = streams.producer()
        await producer.send(broken, b"a", partition=0)
        await producer.send(healthy, b"b", partition=0)
        await producer.close()
        await redis.delete(key)
        await redis.set(key, b"not a stream")
        with caplog.at_level(logging.WARNING, "pipeline.transport.redis_streams.admin"):
            listed = await admin.list_topics()
            await admin.create_topic(TopicConfig(f"lwtnew_{unique}", 1))
        assert listed[broken].message_counts == (1, 0)
        assert listed[healthy].message_counts == (1,)
        lines = [r.getMessage() for r in caplog.records if key in r.getMessage()]
        assert len(lines) == 1, lines
        assert "WRONGTYPE" in lines[0]
        assert "redis-cli DEL" in lines[0]
    finally:
        await redis.delete(key)
        for name in (broken, healthy, f"lwtnew_{unique}"):
            await admin.delete_topic(name)
