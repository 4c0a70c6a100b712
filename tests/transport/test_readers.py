"""Readers (``Transport.reader``) on every transport: positions of their own, no group kept."""

from __future__ import annotations

import time

import pytest
from redis.asyncio import Redis
from support import delete_after_test

from pipeline.config import Settings
from pipeline.envelope import Message, Record, TopicPartition
from pipeline.testing import MemoryTransport
from pipeline.transport import create_transport
from pipeline.transport.protocol import Reader, TopicConfig, Transport
from pipeline.transport.redis_streams import reader as reader_module


async def _read(reader: Reader, n: int, max_messages: int = 500) -> list[Message]:
    """Poll until ``n`` messages came; each poll returns at most ``max_messages``."""
    out: list[Message] = []
    deadline = time.monotonic() + 60
    while len(out) < n:
        assert time.monotonic() < deadline, f"{len(out)} of {n} messages in 60 s"
        batch = await reader.poll(max_messages, 0.2)
        assert len(batch) <= max_messages
        out += batch
    return out


async def _reads_from_its_own_positions(transport: Transport, topic: str) -> None:
    await transport.admin().create_topic(TopicConfig(topic, 3))
    producer = transport.producer()
    try:
        sent = await producer.send_many(topic, [Record(b"v%d" % i, b"k%d" % i) for i in range(30)])
        latest = transport.reader([topic], start_at="latest")
        assert await latest.poll(500, 0.2) == []
        earliest = transport.reader([topic])
        try:
            got = await _read(earliest, 30, max_messages=2)
            assert sorted(m.value for m in got) == sorted(b"v%d" % i for i in range(30))
            for partition in {d.partition for d in sent}:
                offsets = [m.offset for m in got if m.partition == partition]
                assert offsets == sorted(offsets)
            first = sent[0]
            await earliest.seek(TopicPartition(topic, first.partition), first.offset)
            again = await _read(earliest, 1)
            assert (again[0].partition, again[0].offset) == (first.partition, first.offset)
            assert again[0].value == b"v0"
            new: list[Message] = []
            deadline = time.monotonic() + 60
            while not new:  # Kafka's reader starts once it has assigned itself the partitions
                assert time.monotonic() < deadline, "the latest reader read nothing in 60 s"
                await producer.send(topic, b"new", key=b"k")
                new = await latest.poll(500, 0.2)
            assert {m.value for m in new} == {b"new"}
        finally:
            await earliest.close()
            await latest.close()
    finally:
        await producer.close()


async def test_a_reader_reads_from_where_it_starts_or_seeks(
    transport: Transport, unique: str
) -> None:
    """A reader reads all or only new messages, in order, at most as many as asked, and seeks."""
    topic = f"reader_{unique}"
    delete_after_test(transport, [topic])
    await _reads_from_its_own_positions(transport, topic)


async def test_an_in_memory_reader_reads_from_where_it_starts_or_seeks(unique: str) -> None:
    """The in-memory transport's reader keeps the same promises as the real ones."""
    await _reads_from_its_own_positions(MemoryTransport(), f"reader_{unique}")


async def test_a_redis_reader_removes_one_off_groups_a_killed_run_left(
    settings: Settings, redis: Redis, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tail and dry-run groups of earlier releases, all consumers idle long enough, are removed."""
    transport = create_transport(settings, "redis")
    topic = f"reader_{unique}.dlq"
    delete_after_test(transport, [topic])
    await transport.admin().create_topic(TopicConfig(topic, 1))
    producer = transport.producer()
    await producer.send_many(topic, [Record(b"v%d" % i, b"k") for i in range(5)])
    await producer.close()
    stream = f"{{{settings.redis.key_prefix}:{topic}:0}}:s"
    tail, dry = f"pipeline-tail-{unique[:8]}", f"pipeline-redrive.{topic}.{unique}.dry.0badf00d"
    kept = [f"pipeline-redrive.{topic}.{unique}", f"pipeline-tail-{unique}"]
    for group in [tail, dry, *kept]:
        await redis.xgroup_create(stream, group, id="0")
        await redis.xreadgroup(group, "killed", {stream: ">"})  # the entries it held
    members = f"{{{settings.redis.key_prefix}:g:{tail}}}:members"
    await redis.zadd(members, {"killed": 1})
    try:
        fresh = transport.reader([topic])
        assert len(await _read(fresh, 5)) == 5
        await fresh.close()
        names = {g["name"].decode() for g in await redis.xinfo_groups(stream)}
        assert names == {tail, dry, *kept}  # their consumers were seen just now
        monkeypatch.setattr(reader_module, "STALE_GROUP_MS", 0)
        late = transport.reader([topic])
        assert len(await _read(late, 5)) == 5
        await late.close()
        assert {g["name"].decode() for g in await redis.xinfo_groups(stream)} == set(kept)
        assert await redis.exists(members) == 0
    finally:
        await redis.delete(members)
        await transport.close()
