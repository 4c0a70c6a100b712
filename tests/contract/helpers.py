"""Helpers shared by the transport contract tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient
from redis.asyncio import Redis
from support import delete_after_test

from pipeline.config import Settings
from pipeline.envelope import Message, Position, TopicPartition
from pipeline.testing import MemoryBroker, MemoryTransport
from pipeline.transport import create_transport
from pipeline.transport.protocol import Consumer, TopicConfig, Transport
from pipeline.transport.redis_streams.keys import Keys, entry_id


async def make_topic(transport: Transport, name: str, partitions: int) -> None:
    """Create a fresh topic for one test; deleted when the test ends."""
    delete_after_test(transport, [name])
    await transport.admin().create_topic(TopicConfig(name, partitions))


async def consume_until(
    consumer: Consumer,
    done: Callable[[list[Message]], bool],
    *,
    timeout_s: float = 60.0,
    commit: bool = True,
) -> list[Message]:
    """Poll until ``done(received)`` holds, committing each batch; fail after ``timeout_s``."""
    received: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while not done(received):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met after {timeout_s}s; got {len(received)} msgs")
        batch = await consumer.poll(500, 0.5)
        received += batch
        if commit and batch:
            await consumer.commit(positions_after(batch))
    return received


def positions_after(batch: list[Message]) -> list[Position]:
    """The commit positions just past the last message of each partition in ``batch``."""
    last: dict[TopicPartition, int] = {}
    for msg in batch:
        last[msg.tp] = max(last.get(msg.tp, -1), msg.offset)
    return [Position(tp, offset + 1) for tp, offset in last.items()]


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    """Re-check ``predicate`` until it is true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met after {timeout_s}s")
        await asyncio.sleep(0.05)


def unreachable(dead: Settings, transport: Transport) -> Transport:
    """A transport like ``transport`` whose broker does not answer (``dead`` names no server)."""
    if transport.name == "memory":
        return MemoryTransport(MemoryBroker(available=False))
    return create_transport(dead, transport.name)


class RecordingListener:
    """Remembers what it was told and hands back fixed positions on revocation."""

    def __init__(self, to_commit: list[Position] | None = None) -> None:
        """Return ``to_commit`` (those of the revoked partitions) from on_revoked."""
        self.assigned: list[TopicPartition] = []
        self.committed: dict[TopicPartition, Position] = {}
        self.revoked: list[tuple[TopicPartition, bool]] = []
        self.to_commit = to_commit or []

    async def on_assigned(
        self, partitions: Sequence[TopicPartition], committed: Mapping[TopicPartition, Position]
    ) -> None:
        """Record the partitions and their committed positions."""
        self.assigned += partitions
        self.committed.update(committed)

    async def on_revoked(
        self, partitions: Sequence[TopicPartition], *, lost: bool
    ) -> Sequence[Position]:
        """Record the revocation and return the positions to commit."""
        self.revoked += [(tp, lost) for tp in partitions]
        return [p for p in self.to_commit if p.tp in partitions]


async def expire_below(
    transport: Transport, settings: Settings, tp: TopicPartition, upto: int
) -> None:
    """Make the records of ``tp`` below ``upto`` disappear, as retention or a trim would.

    Kafka's ``delete_records`` moves the partition's start; Redis Streams' ``XTRIM MINID``
    drops the entries of the stream.
    """
    if transport.name == "kafka":
        admin = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
        futures = admin.delete_records([KafkaPartition(tp.topic, tp.partition, upto)])
        await asyncio.to_thread(lambda: [future.result(30) for future in futures.values()])
        return
    client = Redis.from_url(settings.redis.url)
    try:
        stream = Keys(settings.redis.key_prefix).stream(tp.topic, tp.partition)
        await client.xtrim(stream, minid=entry_id(upto), approximate=False)
    finally:
        await client.aclose()
