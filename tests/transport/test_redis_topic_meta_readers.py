"""Readers of a Redis Streams topic's metadata facing an entry they cannot read.

The topics hash is plain Redis: a hand edit, another program or another release may leave a
topic's value malformed. Every reader (admin, producer, consumer, reader, the CLI) must then fail
with one :class:`TransportError` line naming the topic, the field and the fix; `topics list`
shows the other topics, and the topic can still be deleted. Each test keeps its topics under a
key prefix of its own, so the malformed entry is never seen by tests running beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pipeline.config import Settings
from pipeline.errors import TransportError
from pipeline.transport.protocol import TopicConfig
from pipeline.transport.redis_streams.admin import UnreadableTopicMeta
from pipeline.transport.redis_streams.keys import Keys
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

pytestmark = pytest.mark.usefixtures("redis_service")

MALFORMED = [
    ('{"partitions": "two"}', "'partitions'"),
    ('{"max_len": 5}', "'partitions'"),
    ('{"partitions": 0}', "'partitions'"),
    ('{"partitions": true}', "'partitions'"),
    ('{"partitions": 2, "max_len": "many"}', "'max_len'"),
    ('{"partitions": 2, "retention_ms": "7d"}', "'retention_ms'"),
    ("[2]", "JSON object"),
    ("not json", "not JSON"),
    ("[" * 100_000 + "]" * 100_000, "not JSON"),  # past the parser: RecursionError
]


@pytest.fixture
def own_prefix(settings: Settings, unique: str) -> Settings:
    """The test settings with a Redis key prefix of this test's own (deleted by ``unique``)."""
    redis = settings.redis.model_copy(update={"key_prefix": f"bm{unique}"})
    return settings.model_copy(update={"redis": redis})


@pytest.fixture
async def transport(own_prefix: Settings) -> AsyncIterator[RedisStreamsTransport]:
    """A Redis Streams transport under the test's own key prefix."""
    t = RedisStreamsTransport(own_prefix)
    yield t
    await t.close()


async def _malformed_topic(
    transport: RedisStreamsTransport, redis: Redis, topic: str, value: str
) -> Keys:
    """Create ``topic`` with 2 partitions and one message, then store ``value`` as its metadata."""
    await transport.admin().create_topic(TopicConfig(topic, 2))
    producer = transport.producer()
    await producer.send(topic, b"v", key=b"k", partition=1)
    await producer.close()
    keys = Keys(transport._settings.redis.key_prefix)
    await redis.hset(keys.topics, topic, value)
    return keys


def _assert_one_line(error: str, topic: str, field: str) -> None:
    """``error`` is one line naming ``topic``, ``field`` and the fix."""
    assert "\n" not in error.strip()
    assert repr(topic) in error
    assert field in error
    assert "pipeline topics apply" in error
    assert "HDEL" in error


@pytest.mark.parametrize(("value", "field"), MALFORMED)
async def test_malformed_metadata_is_one_transport_error_for_every_reader(
    transport: RedisStreamsTransport, redis: Redis, unique: str, value: str, field: str
) -> None:
    """Admin, producer, consumer and reader each raise one TransportError line naming the topic."""
    topic = f"badmeta-{unique}"
    keys = await _malformed_topic(transport, redis, topic, value)
    admin = transport.admin()
    try:
        with pytest.raises(TransportError) as listed:
            await admin.list_topics([topic])
        _assert_one_line(str(listed.value), topic, field)
        with pytest.raises(TransportError) as lag:
            await admin.group_lag(f"g-{unique}", topic)
        _assert_one_line(str(lag.value), topic, field)
        producer = transport.producer()
        try:
            with pytest.raises(TransportError) as sent:
                await producer.send(topic, b"v", key=b"k")
            _assert_one_line(str(sent.value), topic, field)
        finally:
            await producer.close()
        consumer = transport.consumer(f"g-{unique}", [topic])
        try:
            with pytest.raises(TransportError) as polled:
                await consumer.poll(10, 0.05)
            _assert_one_line(str(polled.value), topic, field)
        finally:
            await consumer.close()
        reader = transport.reader([topic], start_at="earliest")
        try:
            with pytest.raises(TransportError) as read:
                await reader.poll(10, 0.05)
            _assert_one_line(str(read.value), topic, field)
        finally:
            await reader.close()
    finally:
        await redis.hdel(keys.topics, topic)  # its streams hold ``unique``: deleted after


@pytest.mark.parametrize(("value", "field"), MALFORMED)
async def test_a_topic_with_malformed_metadata_can_be_deleted(
    transport: RedisStreamsTransport, redis: Redis, unique: str, value: str, field: str
) -> None:
    """Deleting such a topic removes its entry, streams and offset counters."""
    del field
    topic = f"badmeta-{unique}"
    other = f"badmeta-{unique}-1"  # its keys look like a partition's of ``topic``: kept
    keys = await _malformed_topic(transport, redis, topic, value)
    await transport.admin().create_topic(TopicConfig(other, 1))
    producer = transport.producer()
    await producer.send(other, b"v", partition=0)
    await producer.close()
    try:
        await transport.admin().delete_topic(topic)

        assert await redis.hexists(keys.topics, topic) == 0
        for p in range(2):
            assert await redis.exists(keys.stream(topic, p), keys.sequence(topic, p)) == 0
        assert await redis.exists(keys.stream(other, 0), keys.sequence(other, 0)) == 2
    finally:
        await redis.hdel(keys.topics, topic, other)  # their streams hold ``unique``


def _pipeline(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline ARGS`` on Redis under ``settings``' key prefix and capture its output."""
    env = {
        **os.environ,
        "COLUMNS": "200",
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": settings.redis.url,
        "PIPELINE_REDIS__KEY_PREFIX": settings.redis.key_prefix,
    }
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        check=False,
    )


async def test_topics_list_shows_the_readable_topics_and_names_the_malformed_one(
    transport: RedisStreamsTransport, own_prefix: Settings, redis: Redis, unique: str
) -> None:
    """`topics list` prints the other topics, then one error line per malformed one, exit 1."""
    topic, good = f"badmeta-{unique}", f"goodmeta-{unique}"
    keys = await _malformed_topic(transport, redis, topic, '{"partitions": "two"}')
    await transport.admin().create_topic(TopicConfig(good, 3))
    try:
        for args in (("topics", "list"), ("topics", "list", "--json")):
            listed = _pipeline(own_prefix, *args)
            assert listed.returncode == 1, listed.stderr
            assert "Traceback" not in listed.stderr
            assert good in listed.stdout
            assert topic not in listed.stdout
            _assert_one_line(listed.stderr, topic, "'partitions'")
            assert listed.stderr.startswith("error:")
        rows = [json.loads(line) for line in _pipeline(own_prefix, *args).stdout.splitlines()]
        assert [(row["topic"], row["partitions"]) for row in rows] == [(good, 3)]
    finally:
        await redis.hdel(keys.topics, topic, good)  # their streams hold ``unique``


async def test_tail_of_a_topic_with_malformed_metadata_is_one_line(
    transport: RedisStreamsTransport, own_prefix: Settings, redis: Redis, unique: str
) -> None:
    """`tail` (from the beginning or not) ends with one error line naming the topic, exit 1."""
    topic = f"badmeta-{unique}"
    keys = await _malformed_topic(transport, redis, topic, "not json")
    try:
        for args in (("tail", topic), ("tail", topic, "--from-beginning", "-n", "1")):
            tailed = _pipeline(own_prefix, *args)
            assert tailed.returncode == 1, tailed.stderr
            assert "Traceback" not in tailed.stderr
            _assert_one_line(tailed.stderr, topic, "not JSON")
    finally:
        await redis.hdel(keys.topics, topic)  # its streams hold ``unique``


async def test_listing_names_every_unreadable_entry_and_keeps_the_others(
    transport: RedisStreamsTransport, redis: Redis, unique: str
) -> None:
    """list_topics raises one error for all unreadable entries, a field not UTF-8 among them."""
    topic, good = f"badmeta-{unique}", f"goodmeta-{unique}"
    keys = await _malformed_topic(transport, redis, topic, "[2]")
    await transport.admin().create_topic(TopicConfig(good, 3))
    await redis.hset(keys.topics, b"\xff" + unique.encode(), "{}")
    try:
        with pytest.raises(UnreadableTopicMeta) as listed:
            await transport.admin().list_topics()
        assert list(listed.value.readable) == [good]
        assert listed.value.readable[good].partitions == 3
        first, second = listed.value.lines
        _assert_one_line(first, topic, "JSON object")
        assert "not UTF-8" in second
        assert f'HDEL {keys.topics} "\\xff{unique}"' in second
        assert str(listed.value) == f"{first} (and 1 more such entries)"
        assert await transport.admin().list_topics([good]) == listed.value.readable
    finally:
        await redis.hdel(keys.topics, topic, good, b"\xff" + unique.encode())
