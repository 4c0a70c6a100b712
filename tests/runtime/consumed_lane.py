"""A Kafka lane its consumer group consumed before: the state a restarted member finds."""

from __future__ import annotations

import asyncio

from confluent_kafka import Consumer, TopicPartition
from runtime.helpers import declare
from support import delete_group_after

from pipeline.config import Settings
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """Group ``group`` commits ``offset`` on partition 0 of ``topic``, as a member once did."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


async def consumed_lane(settings: Settings, spec: TopicSpec, group: str) -> None:
    """Declare ``spec``'s topics (deleted after the test), one message, ``group`` committed past it.

    The group is deleted after the test too.
    """
    transport = create_transport(settings, "kafka")
    try:
        await declare(transport, spec)
        delete_group_after(transport, group, spec.topic_names())
        producer = transport.producer()
        try:
            await producer.send(spec.name, b"consumed before", key=b"k")
        finally:
            await producer.close()
    finally:
        await transport.close()
    await asyncio.to_thread(_commit, settings.kafka.bootstrap_servers, group, spec.name, 1)
