"""Stream entries another program wrote with a raw ``XADD``: they reach the member, in order.

Any Redis client can append to a topic's stream. Fields the pipeline's producer never writes
(a header name that is not UTF-8, a ``t`` that is no number) must not make every poll of the
partition fail: the entry is delivered as best it can be read, and the ones after it flow.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from contract.helpers import consume_until, make_topic
from redis.asyncio import Redis

from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.transport.redis_streams.admin import RedisStreamsAdmin
from pipeline.transport.redis_streams.consumer import RedisStreamsConsumer
from pipeline.transport.redis_streams.keys import Keys, offset_of
from pipeline.transport.redis_streams.producer import RedisStreamsProducer
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

pytestmark = pytest.mark.usefixtures("redis_service")


@dataclass(frozen=True)
class Rig:
    """A one-partition topic, its stream key, a producer and a consumer of one group."""

    topic: str
    group: str
    stream: str
    producer: RedisStreamsProducer
    consumer: RedisStreamsConsumer
    admin: RedisStreamsAdmin


@pytest.fixture
async def rig(settings: Settings, unique: str) -> AsyncIterator[Rig]:
    """The topic foreign_<unique> and its clients; closed and the group deleted afterwards."""
    transport = RedisStreamsTransport(settings)
    topic, group = f"foreign_{unique}", f"g-{unique}"
    await make_topic(transport, topic, 1)
    stream = Keys(settings.redis.key_prefix).stream(topic, 0)
    producer = transport.producer()
    consumer = transport.consumer(group, [topic])
    try:
        yield Rig(topic, group, stream, producer, consumer, transport.admin())
    finally:
        await consumer.close()
        await producer.close()
        await transport.admin().delete_group(group, [topic])
        await transport.close()


async def test_raw_entries_with_unreadable_fields_are_delivered_in_order(
    settings: Settings, redis: Redis, rig: Rig
) -> None:
    """A foreign entry whose header name is not UTF-8 or whose t is unreadable is delivered."""
    keys = Keys(settings.redis.key_prefix)
    await rig.producer.send(rig.topic, b"before", partition=0)
    raw = ({b"v": b"bad-name", b"h.\xff\xfe": b"x"}, {b"v": b"bad-t", b"t": b"9" * 5000})
    for fields in raw:
        offset = await redis.incr(keys.sequence(rig.topic, 0))
        await redis.xadd(rig.stream, fields, id=f"{offset}-0")  # type: ignore[arg-type]
    await rig.producer.send(rig.topic, b"after", partition=0)

    got = await consume_until(rig.consumer, lambda r: len(r) >= 4, timeout_s=30)

    assert [(m.offset, m.value) for m in got] == [
        (0, b"before"),
        (1, b"bad-name"),
        (2, b"bad-t"),
        (3, b"after"),
    ]
    assert got[1].headers == {"\\xff\\xfe": b"x"}
    assert got[2].timestamp_ms == 0


async def test_production_continues_after_a_raw_entry_with_an_id_above_the_counter(
    redis: Redis, rig: Rig
) -> None:
    """After raw XADDs with an auto id and an explicit id above the counter, sends still land."""
    producer, topic, stream = rig.producer, rig.topic, rig.stream
    await producer.send(topic, b"before", partition=0)
    await redis.xadd(stream, {b"v": b"auto-id", b"t": b"1"})  # id: Redis's clock, ~1.8e12
    sent = [await producer.send(topic, b"after-auto", partition=0)]
    top = sent[0].offset + 1  # that entry's id is top-0
    await redis.xadd(stream, {b"v": b"explicit-id", b"t": b"1"}, id=f"{top + 5}-0")
    sent += await producer.send_many(topic, [Record(b"after-explicit", partition=0)] * 2)

    got = await consume_until(rig.consumer, lambda r: len(r) >= 6, timeout_s=30)

    assert [m.value for m in got] == [
        b"before",
        b"auto-id",
        b"after-auto",
        b"explicit-id",
        b"after-explicit",
        b"after-explicit",
    ]
    offsets = [m.offset for m in got]
    assert offsets == sorted(set(offsets))
    assert [d.offset for d in sent] == [offsets[2], offsets[4], offsets[5]]
    (lag,) = await rig.admin.group_lag(rig.group, topic)
    assert (lag.committed, lag.end, lag.oldest_unconsumed_ms) == (offsets[-1] + 1,) * 2 + (None,)


async def test_lag_counts_a_raw_entry_above_the_counter_and_reads_one_without_t(
    redis: Redis, rig: Rig
) -> None:
    """group_lag ends past a raw auto-id entry nothing followed yet and reads a missing t as 0."""
    await rig.producer.send(rig.topic, b"before", partition=0)
    await consume_until(rig.consumer, lambda r: len(r) >= 1, timeout_s=30)
    foreign = offset_of(await redis.xadd(rig.stream, {b"v": b"no-t"}))

    (lag,) = await rig.admin.group_lag(rig.group, rig.topic)

    assert (lag.committed, lag.end, lag.oldest_unconsumed_ms) == (1, foreign + 1, 0)
    (got,) = await consume_until(rig.consumer, lambda r: len(r) >= 1, timeout_s=30)
    assert (got.offset, got.value) == (foreign, b"no-t")
    (lag,) = await rig.admin.group_lag(rig.group, rig.topic)
    assert (lag.committed, lag.end, lag.lag) == (foreign + 1, foreign + 1, 0)


async def test_raw_entries_of_one_millisecond_are_acknowledged_by_a_commit_past_them(
    redis: Redis, rig: Rig
) -> None:
    """Raw entries whose ids share their milliseconds (100-0, 100-1) leave nothing pending."""
    for seq, value in enumerate((b"first", b"second")):
        await redis.xadd(rig.stream, {b"v": value}, id=f"100-{seq}")

    got = await consume_until(rig.consumer, lambda r: len(r) >= 2, timeout_s=30)

    assert [(m.offset, m.value) for m in got] == [(99, b"first"), (99, b"second")]
    assert (await redis.xpending(rig.stream, rig.group))["pending"] == 0
