"""Partitions added to a topic while a classic group has been running are given out promptly.

A classic group's assignment changes when a member's client sees the topic's partition count
change in its metadata. librdkafka refreshes a subscribed topic's metadata every
``topic.metadata.refresh.interval.ms`` (300 s by default), so partitions ``pipeline topics
apply`` added to a settled group's topic sat unread for up to five minutes while the producers
already sent keys there (the strand watch sometimes nudged the group sooner, with a warning
that blamed a cooperative rebalance). KIP-848 groups are assigned by the broker, which knows at
once; this is the classic path that every ``pipeline consume`` (a static member) takes.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from contract.helpers import make_topic
from support import delete_group_after

from pipeline.config import Settings
from pipeline.envelope import TopicPartition
from pipeline.transport.kafka.consumer import KafkaConsumer
from pipeline.transport.kafka.transport import KafkaTransport
from pipeline.transport.protocol import TopicConfig

pytestmark = pytest.mark.usefixtures("kafka_service")

SETTLED_S = 6.0
"""How long the group runs before the topic grows: past the metadata librdkafka fetches when a
member joins, so only its periodic refresh can show the new partitions."""


async def _poll_until(members: list[KafkaConsumer], owned: int, timeout_s: float) -> float:
    """Poll every member until they own ``owned`` partitions in all; the seconds it took."""
    start = time.monotonic()
    while sum(len(m.assignment()) for m in members) != owned:
        elapsed = time.monotonic() - start
        assert elapsed < timeout_s, (
            f"own {[sorted(m.assignment()) for m in members]} after {timeout_s:.0f}s"
        )
        for member in members:
            await member.poll(10, 0.1)
    return time.monotonic() - start


async def test_a_settled_classic_group_takes_up_partitions_added_to_its_topic(
    settings: Settings, unique: str
) -> None:
    """Two classic members of a two-partition topic grown to four own all four within 30 s."""
    kafka = settings.kafka.model_copy(update={"group_protocol": "classic"})
    transport = KafkaTransport(settings.model_copy(update={"kafka": kafka}))
    topic, group = f"walk_grow_{unique}", f"walk-grow-{unique}"
    await make_topic(transport, topic, 2)
    members = [KafkaConsumer(kafka, group, [topic], member_id=f"m{i}") for i in range(2)]
    # Static members keep their slots after close until their sessions end: the group is
    # deleted once it has none (at the test's end, or at the session's).
    delete_group_after(transport, group, [topic])
    try:
        await _poll_until(members, 2, timeout_s=60)
        settled = time.monotonic() + SETTLED_S
        while time.monotonic() < settled:  # a running group, not a synchronisation
            for member in members:
                await member.poll(10, 0.1)
        assert sum(len(m.assignment()) for m in members) == 2
        await transport.admin().update_topic(TopicConfig(topic, 4))
        await _poll_until(members, 4, timeout_s=30)
        owned = set().union(*(m.assignment() for m in members))
        assert owned == {TopicPartition(topic, p) for p in range(4)}
    finally:
        await asyncio.gather(*(m.close() for m in members))
