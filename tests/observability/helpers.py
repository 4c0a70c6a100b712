"""Shared by the observability tests: a lane on a real broker with a group part way through."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from support import delete_after_test

from pipeline.envelope import Message, Position, TopicPartition
from pipeline.errors import PipelineError
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Consumer, Transport


@dataclass
class PartlyConsumed:
    """A lane whose group committed the first ``committed`` messages of partition 0."""

    spec: TopicSpec
    group: str
    messages: list[Message]
    consumer: Consumer

    async def commit(self, offset: int) -> None:
        """Commit partition 0 up to ``offset``."""
        await self.consumer.commit([Position(TopicPartition(self.spec.name, 0), offset)])


def lane_spec(name: str) -> TopicSpec:
    """A two-partition lane with one retry tier (lane named like the topic)."""
    return TopicSpec.model_validate(
        {"name": name, "partitions": 2, "lane": name.replace("-", "_"), "retry": {"tiers": ["5s"]}}
    )


@asynccontextmanager
async def partly_consumed(
    transport: Transport, spec: TopicSpec, group: str, *, produced: int, committed: int
) -> AsyncIterator[PartlyConsumed]:
    """Produce to partition 0, plus one retry and one dead letter; commit the first ones."""
    delete_after_test(transport, spec.topic_names())
    await apply(transport.admin(), [spec], 100_000, dry_run=False)
    producer = transport.producer()
    try:
        for _ in range(produced):
            await producer.send(spec.name, b"{}", key=b"k", partition=0)
        await producer.send(spec.retry_topic_names()[0], b"{}", key=b"k", partition=0)
        await producer.send(spec.dead_letter, b"{}", key=b"k", partition=0)
    finally:
        await producer.close()
    consumer = transport.consumer(group, [spec.name])
    seen: list[Message] = []
    deadline = time.monotonic() + 60
    try:
        while len(seen) < produced:
            assert time.monotonic() < deadline, f"consumed {len(seen)} of {produced} in 60 s"
            seen.extend(await consumer.poll(100, 0.5))
        lane = PartlyConsumed(spec, group, sorted(seen, key=lambda m: m.offset), consumer)
        await lane.commit(committed)
        yield lane
    finally:
        await consumer.close()


async def drop(transport: Transport, spec: TopicSpec) -> None:
    """Delete the lane's topics."""
    admin = transport.admin()
    for topic in spec.topic_names():
        with contextlib.suppress(PipelineError):
            await admin.delete_topic(topic)
