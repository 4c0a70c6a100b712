"""A topic's stream key holding another type is named in one line that says what to do.

Another program that wrote a string where a partition's stream lives (``SET {pl:T:1}:s ...``)
made ``pipeline produce`` say ``produce to 'T': WRONGTYPE Operation against a key holding the
wrong kind of value`` and ``pipeline topics list`` and ``tail`` say ``list topics: Command # 2
(XLEN {pl:T:1}:s) of pipeline caused error: ('WRONGTYPE ...',)``: Redis's words, redis-py's
pipeline wording, and nothing about the cause or the fix. Listing now counts that partition as
empty, with one warning naming the key and the fix: a listing that failed stopped `pipeline
topics apply` of every topic (tests/transport/test_redis_list_wrong_type_key.py).
"""

from __future__ import annotations

import logging

import pytest
from contract.helpers import make_topic
from redis.asyncio import Redis

from pipeline.config import Settings
from pipeline.errors import TransportError
from pipeline.transport.redis_streams.keys import Keys
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

pytestmark = pytest.mark.usefixtures("redis_service")


async def test_a_stream_key_of_another_type_is_named_with_the_fix(
    settings: Settings, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Producing says the partition's key holds no stream; listing names the key and the fix."""
    transport = RedisStreamsTransport(settings)
    topic = f"walk_wt_{unique}"
    await make_topic(transport, topic, 2)
    key = Keys(settings.redis.key_prefix).stream(topic, 1)
    client = Redis.from_url(settings.redis.url)
    admin = transport.admin()
    producer = transport.producer()
    try:
        await client.delete(key)
        await client.set(key, b"not a stream")
        with caplog.at_level(logging.WARNING, "pipeline.transport.redis_streams.admin"):
            listed = await admin.list_topics([topic])
        assert listed[topic].message_counts == (0, 0)
        warned = (
            f"topic {topic!r} partition 1, counted as empty: its Redis key {key!r} holds no stream"
            " (WRONGTYPE): something other than pipeline wrote it; look at it (`redis-cli TYPE"
            f" {key}`) and delete it (`redis-cli DEL {key}`): its stream is made again at its"
            " next message"
        )
        assert [r.getMessage() for r in caplog.records] == [warned]
        with pytest.raises(TransportError) as sent:
            await producer.send(topic, b"x", partition=1)
        sequence = Keys(settings.redis.key_prefix).sequence(topic, 1)
        assert str(sent.value) == (
            f"produce to {topic!r}: Redis key {key!r} (the partition's stream) or {sequence!r} "
            "(its offset counter) holds another type (WRONGTYPE): something other than pipeline "
            "wrote it; look at them (`redis-cli TYPE KEY`) and delete the one that is no stream, "
            "no integer: a deleted stream is made again at the next message"
        )
    finally:
        await producer.close()
        await client.delete(key)
        await admin.delete_topic(topic)
        await client.aclose()
        await transport.close()
