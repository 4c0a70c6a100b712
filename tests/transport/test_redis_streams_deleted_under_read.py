"""A topic deleted under a member's blocked read on Redis Streams ends that read: UnknownTopic.

``Admin.delete_topic`` deleted the topic's streams before its metadata. Deleting the stream
unblocks the member's read at once (``UNBLOCKED``), and the member looked for the topic while
its metadata was still there (about one run in three): it took its partitions up again and
returned nothing, and its next poll made the deleted topic's stream anew (``XGROUP CREATE
MKSTREAM``) and read on from it. The metadata now goes first.
"""

from __future__ import annotations

import asyncio

import pytest
from runtime.private_redis import bare_client

from pipeline.config import Settings
from pipeline.errors import UnknownTopic
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig
from pipeline.transport.redis_streams.keys import Keys

RUNS = 12
"""Runs of the race: with the streams deleted first, each took the topic up again 1 in 3."""


async def test_a_topic_deleted_under_a_blocked_read_ends_it_every_time(
    settings: Settings, unique: str
) -> None:
    """Topics A and B; A's member blocks in its read; A deleted: the read raises UnknownTopic."""
    prefix = f"t{unique}"
    keys = Keys(prefix)
    async with bare_client() as (server, client):
        redis = settings.redis.model_copy(update={"url": server.url, "key_prefix": prefix})
        transport = create_transport(settings.model_copy(update={"redis": redis}), "redis")
        admin = transport.admin()
        try:
            await admin.create_topic(TopicConfig(f"b_{unique}", 1))
            for run in range(RUNS):
                topic = f"a{run}_{unique}"
                await admin.create_topic(TopicConfig(topic, 1))
                consumer = transport.consumer(f"g{run}-{unique}", [topic])
                try:
                    while not consumer.assignment():
                        await consumer.poll(10, 0.1)
                    polling = asyncio.ensure_future(consumer.poll(10, 30))
                    while int((await client.info("clients"))["blocked_clients"]) < 1:
                        assert not polling.done(), polling
                    await admin.delete_topic(topic)
                    with pytest.raises(UnknownTopic, match=f"topic '{topic}' does not exist"):
                        await polling
                finally:
                    await consumer.close()
                assert await client.exists(keys.stream(topic, 0)) == 0, run  # not made anew
        finally:
            await transport.close()
