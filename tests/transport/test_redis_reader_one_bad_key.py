"""One partition's stream key of another type must not stop a Redis Streams reader's others.

The reader of ``pipeline tail`` and a redrive's dry run reads all its partitions with one
``XREAD``; a partition's stream key that another program overwrote with a string failed it
whole (``WRONGTYPE``), before and after its first read, with a line naming no key: the tail
printed nothing of the healthy partitions. Now the others are read, one line names the bad
partition, its key and what to do, and once the key is deleted the partition is read again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pipeline.config import Settings
from pipeline.envelope import Message
from pipeline.transport.protocol import Producer, Reader, TopicConfig, Transport

PARTITIONS = 4
BAD = 1
READER_LOGGER = "pipeline.transport.redis_streams.reader"
BOUND_S = 30.0
"""A bound on waiting for what must come, never a measure."""


@pytest.fixture
async def topic(streams: Transport, unique: str) -> AsyncIterator[str]:
    """A topic of four partitions, each holding two messages, deleted after the test."""
    name = f"rbad_{unique}"
    admin = streams.admin()
    await admin.create_topic(TopicConfig(name, PARTITIONS))
    try:
        producer = streams.producer()
        for p in range(PARTITIONS):
            for i in range(2):
                await producer.send(name, b"before-%d-%d" % (p, i), partition=p)
        await producer.close()
        yield name
    finally:
        await admin.delete_topic(name)


def _stream(settings: Settings, topic: str, partition: int) -> str:
    return f"{{{settings.redis.key_prefix}:{topic}:{partition}}}:s"


async def _read_until(reader: Reader, wanted: set[bytes]) -> list[Message]:
    """Poll until every value of ``wanted`` came (within :data:`BOUND_S`); all polled."""
    got: list[Message] = []
    deadline = time.monotonic() + BOUND_S
    while not wanted <= {m.value for m in got}:
        assert time.monotonic() < deadline, sorted(m.value for m in got)
        got += await reader.poll(100, 0.2)
    return got


async def _healthy_read_on(producer: Producer, reader: Reader, topic: str) -> None:
    """One message sent to each healthy partition is read, the bad one set aside."""
    healthy = {b"after-%d" % p for p in range(PARTITIONS) if p != BAD}
    for p in range(PARTITIONS):
        if p != BAD:
            await producer.send(topic, b"after-%d" % p, partition=p)
    got = await _read_until(reader, healthy)
    assert sorted(m.value for m in got) == sorted(healthy)


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == READER_LOGGER and r.levelno >= logging.WARNING
    ]


def _expected_line(topic: str, stream: str) -> str:
    return (
        f"partition {topic}[{BAD}] is not read: its Redis key {stream!r} holds no stream "
        f"(WRONGTYPE): something other than pipeline wrote it; look at it (`redis-cli TYPE "
        f"{stream}`) and delete it (`redis-cli DEL {stream}`): the partition's stream is made "
        "again at its next message and read from then on; the other partitions are read"
    )


@pytest.mark.parametrize("start_at", ["earliest", "latest"])
async def test_a_key_of_another_type_before_the_first_read(
    start_at: str,
    topic: str,
    streams: Transport,
    settings: Settings,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The healthy partitions are read, the bad one named once; deleted, it is read again."""
    caplog.set_level(logging.INFO, READER_LOGGER)
    stream = _stream(settings, topic, BAD)
    await redis.set(stream, b"not a stream")
    reader = streams.reader([topic], start_at="earliest" if start_at == "earliest" else "latest")
    producer = streams.producer()
    try:
        if start_at == "earliest":
            before = {
                b"before-%d-%d" % (p, i) for p in range(PARTITIONS) if p != BAD for i in (0, 1)
            }
            got = await _read_until(reader, before)
            assert sorted(m.value for m in got) == sorted(before)
        else:
            assert await reader.poll(100, 0.2) == []  # at the end of each healthy partition
        await _healthy_read_on(producer, reader, topic)
        assert _lines(caplog) == [_expected_line(topic, stream)]

        await redis.delete(stream)  # as the line says
        await producer.send(topic, b"repaired", partition=BAD)
        got = await _read_until(reader, {b"repaired"})
        assert [(m.partition, m.value) for m in got] == [(BAD, b"repaired")]
        assert _lines(caplog) == [_expected_line(topic, stream)]  # named once in all
    finally:
        await producer.close()
        await reader.close()


async def test_a_key_overwritten_while_the_reader_reads(
    topic: str,
    streams: Transport,
    settings: Settings,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stream overwritten after reads began: the others read on, each message once."""
    stream = _stream(settings, topic, BAD)
    reader = streams.reader([topic], start_at="earliest")
    producer = streams.producer()
    try:
        before = {b"before-%d-%d" % (p, i) for p in range(PARTITIONS) for i in (0, 1)}
        got = await _read_until(reader, before)
        assert sorted(m.value for m in got) == sorted(before)
        await redis.set(stream, b"not a stream")
        await _healthy_read_on(producer, reader, topic)
        assert _lines(caplog) == [_expected_line(topic, stream)]

        await redis.delete(stream)
        sent = await producer.send(topic, b"repaired", partition=BAD)
        got = await _read_until(reader, {b"repaired"})
        assert [(m.partition, m.offset, m.value) for m in got] == [(BAD, sent.offset, b"repaired")]
    finally:
        await producer.close()
        await reader.close()
