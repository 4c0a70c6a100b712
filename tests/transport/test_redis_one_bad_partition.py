"""One partition's stream key in a bad state must not stop a Redis Streams member's others.

A member reads all its partitions with one ``XREADGROUP``. One partition's stream key overwritten
with another type (``WRONGTYPE``), its group destroyed by an operator (``NOGROUP``) or the key
evicted failed that whole read, so the member's other partitions stopped too. Now the healthy
partitions keep flowing, the bad one gets one line naming its key and what to do, and it is
tried again on its own until its key is repaired.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, running

from pipeline.config import Settings
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport
from pipeline.transport.redis_streams.keys import Keys

PARTITIONS = 4
BAD = 1
"""The partition whose stream key is broken."""
CONSUMER_LOGGER = "pipeline.transport.redis_streams.consumer"

Breaking = Callable[[Redis, str, str], Awaitable[None]]


async def _wrong_type(client: Redis, stream: str, group: str) -> None:
    """Another program writes a string where the partition's stream is."""
    del group
    await client.set(stream, b"not a stream")  # SET replaces the stream in one step


async def _group_destroyed(client: Redis, stream: str, group: str) -> None:
    """An operator destroys the group on the partition's stream."""
    await client.xgroup_destroy(stream, group)


async def _evicted(client: Redis, stream: str, group: str) -> None:
    """The stream key is gone (evicted, deleted by hand)."""
    del group
    await client.delete(stream)


async def _repair_wrong_type(client: Redis, stream: str, group: str) -> None:
    """The operator deletes the string, as the line says: the member makes the stream again."""
    del group
    await client.delete(stream)


async def _nothing(client: Redis, stream: str, group: str) -> None:
    del client, stream, group


CASES = {
    "wrong_type": (_wrong_type, _repair_wrong_type, "WRONGTYPE"),
    "group_destroyed": (_group_destroyed, _nothing, "NOGROUP"),
    "evicted": (_evicted, _nothing, "NOGROUP"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_one_bad_partition_leaves_the_others_flowing(
    case: str,
    streams: Transport,
    settings: Settings,
    unique: str,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: object,
) -> None:
    """Partition 1 broken: 0, 2 and 3 keep being handled; 1 is named once; repaired, it flows."""
    del caplog_repeats  # on the capture handler: repeats backed off as configure_logging does
    breaking, repair, reply = CASES[case]
    spec = lane_spec(f"bad_part_{unique}", PARTITIONS)
    await declare(streams, spec)
    app = App([spec])
    handled: list[tuple[int, bytes]] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        handled.append((ctx.message.partition, event))

    group = f"g-{unique}"
    stream = Keys(settings.redis.key_prefix).stream(spec.name, BAD)
    producer = streams.producer()
    member = Member(app, streams, group, FAST)
    caplog.set_level(logging.WARNING)
    try:
        async with running(member):
            for p in range(PARTITIONS):
                await producer.send(spec.name, b"before-%d" % p, partition=p)
            await eventually(lambda: len(handled) == PARTITIONS, 60)

            await breaking(redis, stream, group)
            healthy = [p for p in range(PARTITIONS) if p != BAD]
            for round_ in range(3):
                for p in healthy:
                    await producer.send(spec.name, b"during-%d-%d" % (round_, p), partition=p)
            during = {(p, b"during-%d-%d" % (r, p)) for r in range(3) for p in healthy}
            await eventually(lambda: during <= set(handled), 30)

            lines = [
                r.getMessage()
                for r in caplog.records
                if r.name == CONSUMER_LOGGER
                and r.levelno >= logging.WARNING
                and stream in r.getMessage()
            ]
            assert lines, "no line names the bad key"
            assert reply in lines[0], lines[0]
            assert f"partition {spec.name}[{BAD}]" in lines[0], lines[0]
            # One line; its repeats (each try of the partition) backed off, counted.
            assert all(line.startswith(f"{lines[0]} [") for line in lines[1:]), lines
            assert all(" more like this in the last " in line for line in lines[1:]), lines

            await repair(redis, stream, group)
            await producer.send(spec.name, b"after", partition=BAD)
            await eventually(lambda: (BAD, b"after") in handled, 30)
            assert (await redis.type(stream)) == b"stream"
    finally:
        await producer.close()
    assert [r.getMessage() for r in caplog.records if "poll failed" in r.getMessage()] == []


async def test_a_bad_key_found_at_join_is_set_aside_and_released_on_close(
    streams: Transport, settings: Settings, unique: str, redis: Redis
) -> None:
    """A key of another type at join: the others are read, it waits; deleted, it is taken up.

    Broken again, it is set aside again; close gives back every lease, the set-aside one's too.
    """
    spec = lane_spec(f"bad_join_{unique}", PARTITIONS)
    await declare(streams, spec)
    keys = Keys(settings.redis.key_prefix)
    stream = keys.stream(spec.name, BAD)
    await redis.set(stream, b"not a stream")
    producer = streams.producer()
    consumer = streams.consumer(f"g-{unique}", [spec.name])
    try:
        for p in range(PARTITIONS):
            if p != BAD:
                await producer.send(spec.name, b"%d" % p, partition=p)
        got: set[int] = set()
        healthy = {p for p in range(PARTITIONS) if p != BAD}

        async def polled() -> None:
            got.update(m.partition for m in await consumer.poll(10, 0.1))

        while got != healthy:
            await asyncio.wait_for(polled(), 30)
        assert {tp.partition for tp in consumer.assignment()} == healthy

        await redis.delete(stream)
        await producer.send(spec.name, b"after", partition=BAD)
        while BAD not in got:
            await asyncio.wait_for(polled(), 30)
        assert {tp.partition for tp in consumer.assignment()} == set(range(PARTITIONS))
        await redis.set(stream, b"not a stream again")  # broken again, then closed
        while BAD in {tp.partition for tp in consumer.assignment()}:
            await asyncio.wait_for(polled(), 30)
    finally:
        await producer.close()
        await consumer.close()
    assert await redis.hlen(keys.owners(f"g-{unique}")) == 0  # the set-aside lease too
