"""A failing message near the size limit is routed, never left to wedge its partition.

The main topic takes a message up to ``PIPELINE_MAX_MESSAGE_BYTES`` (Kafka: the topic's
``max.message.bytes``, which ``pipeline topics apply`` sets to it; Redis Streams: the pipeline's
own check). Its retry and dead-letter copies carry the same key and value plus the headers the
router adds, so they are larger: the retry tiers and the dead-letter topic take that much more
(:data:`~pipeline.transport.limits.COPY_HEADROOM_BYTES`). A real member of an ordered lane, on
both brokers, routes such a message and handles the next one of its key behind it; the group's
committed position reaches the end of the main topic.

On Kafka the producer's own limit (librdkafka's ``message.max.bytes``, set by
:func:`pipeline.transport.kafka.producer.producer_config`) takes the headroom too, or it would
refuse such a copy before the broker sees it.
"""

from __future__ import annotations

import pytest
from contract.helpers import consume_until, wait_for
from redis.asyncio import Redis
from runtime.helpers import FAST, eventually, lane_spec, running
from support import delete_after_test, delete_group_after

from pipeline import headers as h
from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.errors import DeadLetter
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

KEY = b"k"


async def declare_sized(transport: Transport, spec: TopicSpec, max_message_bytes: int) -> None:
    """Create ``spec``'s topics as ``pipeline topics apply`` does; deleted when the test ends."""
    delete_after_test(transport, spec.topic_names())
    await apply(
        transport.admin(), [spec], 100_000, dry_run=False, max_message_bytes=max_message_bytes
    )


def near_limit(max_message_bytes: int) -> Record:
    """A message of key and value ``max_message_bytes - 100`` bytes long, without headers."""
    return Record(b"v" * (max_message_bytes - 100 - len(KEY)), KEY)


async def committed_to_end(transport: Transport, group: str, topic: str) -> bool:
    """Whether ``group``'s committed position is the end of every partition of ``topic``."""
    lags = await transport.admin().group_lag(group, topic)
    return all((lag.committed or 0) >= lag.end for lag in lags)


async def run_lane(
    transport: Transport,
    redis: Redis,
    unique: str,
    spec: TopicSpec,
    big: Record,
    error: Exception,
) -> tuple[Member, list[bytes]]:
    """Run a member whose handler raises ``error`` on ``big`` and takes ``next`` behind it.

    Returns once ``next`` was handled and the group committed the main topic to its end.
    """
    app = App([spec])
    handled: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == big.value:
            raise error
        handled.append(event)

    producer = transport.producer()
    try:
        await producer.send_many(spec.name, [big, Record(b"next", KEY)])
    finally:
        await producer.close()
    group = f"g-{unique}"
    delete_group_after(transport, group, spec.topic_names())
    member = Member(app, transport, group, FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: handled == [b"next"], timeout_s=60)
        await wait_for(lambda: committed_to_end(transport, group, spec.name), timeout_s=60)
    return member, handled


async def dead_letters(transport: Transport, spec: TopicSpec, unique: str) -> list[Record]:
    """The records of ``spec``'s dead-letter topic (read by a group of their own)."""
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    delete_group_after(transport, f"dlq-{unique}", [spec.dead_letter])
    try:
        got = await consume_until(dlq, lambda got: len(got) >= 1)
    finally:
        await dlq.close()
    return [Record(m.value, m.key, m.headers) for m in got]


@pytest.mark.parametrize(
    ("error", "max_attempts", "retried", "dead_headers"),
    [
        pytest.param(
            RuntimeError("upstream said: " + "é" * 5_000),  # a long error text, 2-byte chars
            2,
            1,
            {h.DEAD_REASON: b"exhausted", h.ATTEMPT: b"2"},
            id="retried-then-exhausted",
        ),
        pytest.param(
            DeadLetter("bad input"),
            3,
            0,
            {h.ATTEMPT: b"1", h.ERROR_MESSAGE: b"bad input"},
            id="dead-letter-raised",
        ),
    ],
)
async def test_a_failing_message_near_the_limit_reaches_the_dlq_whole(
    transport: Transport,
    unique: str,
    redis: Redis,
    settings: Settings,
    error: Exception,
    max_attempts: int,
    retried: int,
    dead_headers: dict[str, bytes],
) -> None:
    """Retried through the tier, or ``raise DeadLetter``: its dead letter has its whole value."""
    spec = lane_spec(
        f"near_{unique}",
        1,
        retry={"tiers": ["100ms"], "max_attempts": max_attempts, "after_dead_letter": "proceed"},
    )
    await declare_sized(transport, spec, settings.max_message_bytes)
    big = near_limit(settings.max_message_bytes)
    member, _ = await run_lane(transport, redis, unique, spec, big, error)
    assert member.stats.retried >= retried
    assert member.stats.dead_lettered == 1
    (dead,) = await dead_letters(transport, spec, unique)
    assert dead.value == big.value
    assert dead.key == KEY
    assert dead.headers is not None
    assert {name: dead.headers.get(name) for name in dead_headers} == dead_headers
    assert dead.headers[h.ORIGIN_TOPIC] == spec.name.encode()
