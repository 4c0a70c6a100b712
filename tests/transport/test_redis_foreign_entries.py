"""Stream entries another program wrote with a raw ``XADD``: they reach the member, in order.

Any Redis client can append to a topic's stream. Fields the pipeline's producer never writes
(a header name that is not UTF-8, a ``t`` that is no number) must not make every poll of the
partition fail: the entry is delivered as best it can be read, and the ones after it flow.
"""

from __future__ import annotations

import pytest
from contract.helpers import consume_until, make_topic
from redis.asyncio import Redis

from pipeline.config import Settings
from pipeline.transport.redis_streams.keys import Keys
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

pytestmark = pytest.mark.usefixtures("redis_service")


async def test_raw_entries_with_unreadable_fields_are_delivered_in_order(
    settings: Settings, redis: Redis, unique: str
) -> None:
    """A foreign entry whose header name is not UTF-8 or whose t is unreadable is delivered."""
    transport = RedisStreamsTransport(settings)
    topic, group = f"foreign_{unique}", f"g-{unique}"
    await make_topic(transport, topic, 1)
    keys = Keys(settings.redis.key_prefix)
    producer = transport.producer()
    consumer = transport.consumer(group, [topic])
    try:
        await producer.send(topic, b"before", partition=0)
        raw = ({b"v": b"bad-name", b"h.\xff\xfe": b"x"}, {b"v": b"bad-t", b"t": b"9" * 5000})
        for fields in raw:
            offset = await redis.incr(keys.sequence(topic, 0))
            await redis.xadd(keys.stream(topic, 0), fields, id=f"{offset}-0")  # type: ignore[arg-type]
        await producer.send(topic, b"after", partition=0)

        got = await consume_until(consumer, lambda r: len(r) >= 4, timeout_s=30)

        assert [(m.offset, m.value) for m in got] == [
            (0, b"before"),
            (1, b"bad-name"),
            (2, b"bad-t"),
            (3, b"after"),
        ]
        assert got[1].headers == {"\\xff\\xfe": b"x"}
        assert got[2].timestamp_ms == 0
    finally:
        await consumer.close()
        await producer.close()
        await transport.admin().delete_group(group, [topic])
        await transport.close()
