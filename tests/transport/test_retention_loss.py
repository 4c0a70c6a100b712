"""A group behind retention loses what the broker removed; its member says so, loudly.

Kafka deletes a partition's oldest records by retention (here ``delete_records``); Redis
Streams trims a stream by length (``XADD MAXLEN ~``, here ``XTRIM``) whatever the groups have
read. A member that takes a partition up past such a removal logs one ERROR line naming the
topic, partition, offsets and count, and counts them for
``pipeline_messages_lost_to_retention_total``.
"""

from __future__ import annotations

import logging
import uuid

import pytest
from contract.helpers import consume_until, expire_below, make_topic

from pipeline.config import Settings
from pipeline.envelope import Position, TopicPartition
from pipeline.observability.facades import RetentionLossMetrics
from pipeline.observability.metrics import Metrics
from pipeline.observability.sources import RetentionLossSource
from pipeline.transport.kafka.transport import KafkaTransport
from pipeline.transport.protocol import Transport
from pipeline.transport.retention import lost_to_retention, report_lost


@pytest.mark.parametrize("delivered", [2, 10])
async def test_a_group_behind_retention_is_told_what_it_lost(
    transport: Transport,
    settings: Settings,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    delivered: int,
) -> None:
    """Committed at 2, the first 7 of 10 removed: offsets 2..6 are reported lost, 7..9 read."""
    topic, group = f"lost_{unique}", f"g-{unique}"
    await make_topic(transport, topic, 1)
    producer = transport.producer()
    for i in range(10):
        await producer.send(topic, b"%d" % i, key=b"k", partition=0)
    await producer.close()
    tp = TopicPartition(topic, 0)
    first = transport.consumer(group, [topic])
    read: list[int] = []
    while len(read) < delivered:  # delivered, only the first two committed
        read += [m.offset for m in await first.poll(max_messages=delivered - len(read))]
    await first.commit([Position(tp, 2)])
    await first.close()
    assert read == list(range(delivered))
    await expire_below(transport, settings, tp, 7)
    before = lost_to_retention().get((topic, group), 0)
    second = transport.consumer(group, [topic])
    with caplog.at_level(logging.ERROR, logger="pipeline.transport"):
        rest = await consume_until(second, lambda r: any(m.offset == 9 for m in r))
    await second.close()
    assert [m.offset for m in rest if m.offset >= 7][:1] == [7]
    assert lost_to_retention().get((topic, group), 0) - before == 5
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    told = [line for line in lines if f"{topic}[0]" in line and "2..6" in line and " 5 " in line]
    assert told
    # What to raise is what the broker trims by: Redis by a length, Kafka by time or bytes.
    remedy = (
        "raise the topic's max_len" if transport.name == "redis" else "raise the topic's retention"
    )
    assert remedy in told[0]


async def test_the_member_metrics_count_the_messages_lost_to_retention() -> None:
    """A loss the transport reported shows in pipeline_messages_lost_to_retention_total once."""
    topic, group = f"counted_{uuid.uuid4().hex[:10]}", "g"
    metrics = Metrics()
    source = RetentionLossSource(RetentionLossMetrics(metrics))
    report_lost(group, TopicPartition(topic, 1), 4, 10, transport="redis")
    await source.refresh()
    await source.refresh()
    sample = metrics.registry.get_sample_value(
        "pipeline_messages_lost_to_retention_total", {"topic": topic, "group": group}
    )
    assert sample == 6


async def test_a_running_member_behind_retention_is_told_what_it_lost(
    transport: Transport,
    settings: Settings,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A member that read 0..1, paused while the first 7 of 10 went, reports 2..6 and reads on."""
    topic, group = f"behind_{unique}", f"g-{unique}"
    await make_topic(transport, topic, 1)
    producer = transport.producer()
    for i in range(10):
        await producer.send(topic, b"%d" % i, key=b"k", partition=0)
    await producer.close()
    tp = TopicPartition(topic, 0)
    member = transport.consumer(group, [topic])
    read: list[int] = []
    while len(read) < 2:
        read += [m.offset for m in await member.poll(max_messages=2 - len(read))]
    await member.commit([Position(tp, 2)])
    member.pause([tp])  # what a member's flow control does; the refetch starts at 2
    await expire_below(transport, settings, tp, 7)
    before = lost_to_retention().get((topic, group), 0)
    member.resume([tp])
    with caplog.at_level(logging.ERROR, logger="pipeline.transport"):
        rest = await consume_until(member, lambda r: any(m.offset == 9 for m in r))
    await member.close()
    assert [m.offset for m in rest] == [7, 8, 9]
    assert lost_to_retention().get((topic, group), 0) - before == 5
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert [line for line in lines if f"{topic}[0]" in line and "2..6" in line and " 5 " in line]


@pytest.mark.usefixtures("kafka_service")
async def test_a_kafka_member_logging_only_errors_is_still_told_what_it_lost(
    settings: Settings, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Under log_level 3 a member still counts what it lost, and passes on no warning line."""
    quiet = settings.model_copy(
        update={"kafka": settings.kafka.model_copy(update={"client": {"log_level": "3"}})}
    )
    transport = KafkaTransport(quiet)
    topic, group = f"quiet_{unique}", f"g-{unique}"
    try:
        await make_topic(transport, topic, 1)
        producer = transport.producer()
        for i in range(10):
            await producer.send(topic, b"%d" % i, key=b"k", partition=0)
        await producer.close()
        tp = TopicPartition(topic, 0)
        first = transport.consumer(group, [topic])
        read: list[int] = []
        while len(read) < 2:
            read += [m.offset for m in await first.poll(max_messages=2 - len(read))]
        await first.commit([Position(tp, 2)])
        await first.close()
        await expire_below(transport, settings, tp, 7)
        before = lost_to_retention().get((topic, group), 0)
        second = transport.consumer(group, [topic])
        with caplog.at_level(logging.DEBUG, logger="pipeline.librdkafka"):
            await consume_until(second, lambda r: any(m.offset == 9 for m in r))
        await second.close()
        assert lost_to_retention().get((topic, group), 0) - before == 5
        assert not [r for r in caplog.records if r.name == "pipeline.librdkafka"]
    finally:
        await transport.close()


async def _take_up_and_leave(transport: KafkaTransport, group: str, topic: str) -> int:
    """A member takes ``topic`` up, polls until it counted a loss, and leaves committing nothing.

    Returns how many messages it counted.
    """
    before = lost_to_retention().get((topic, group), 0)
    member = transport.consumer(group, [topic])
    try:
        await consume_until(
            member,
            lambda _r: lost_to_retention().get((topic, group), 0) > before,
            commit=False,
        )
    finally:
        await member.close()
    return lost_to_retention().get((topic, group), 0) - before


@pytest.mark.usefixtures("kafka_service")
async def test_a_kafka_loss_is_counted_once_when_the_partition_moves_before_a_commit(
    settings: Settings, unique: str
) -> None:
    """A member that counted a gap and left committing nothing leaves its successor none."""
    transport = KafkaTransport(settings)
    topic, group = f"once_{unique}", f"g-{unique}"
    try:
        await make_topic(transport, topic, 1)
        producer = transport.producer()
        for i in range(10):
            await producer.send(topic, b"%d" % i, key=b"k", partition=0)
        await producer.close()
        tp = TopicPartition(topic, 0)
        first = transport.consumer(group, [topic])
        while not first.assignment():
            await first.poll(max_messages=1, timeout_s=0.5)
        await first.commit([Position(tp, 2)])
        await first.close()
        await expire_below(transport, settings, tp, 7)
        assert await _take_up_and_leave(transport, group, topic) == 5
        before = lost_to_retention().get((topic, group), 0)
        second = transport.consumer(group, [topic])
        rest = await consume_until(second, lambda r: any(m.offset == 9 for m in r))
        await second.close()
        assert [m.offset for m in rest][:1] == [7]
        assert lost_to_retention().get((topic, group), 0) - before == 0
    finally:
        await transport.close()


async def _committed_at_2(
    transport: KafkaTransport, group: str, topic: str, records: int, metadata: str
) -> TopicPartition:
    """``records`` records in a new ``topic``, ``group`` committed at 2 with ``metadata``."""
    await make_topic(transport, topic, 1)
    producer = transport.producer()
    for i in range(records):
        await producer.send(topic, b"%d" % i, key=b"k", partition=0)
    await producer.close()
    tp = TopicPartition(topic, 0)
    first = transport.consumer(group, [topic])
    while not first.assignment():
        await first.poll(max_messages=1, timeout_s=0.5)
    await first.commit([Position(tp, 2, metadata)])
    await first.close()
    return tp


@pytest.mark.usefixtures("kafka_service")
async def test_a_kafka_member_past_a_gap_keeps_the_runtimes_commit_metadata(
    settings: Settings, unique: str
) -> None:
    """Offsets 8 and 9 recorded done above position 2 are kept as they were past a loss of 2..6."""
    transport = KafkaTransport(settings)
    topic, group = f"meta_{unique}", f"g-{unique}"
    try:
        tp = await _committed_at_2(transport, group, topic, 10, "pl1:6-7")
        await expire_below(transport, settings, tp, 7)
        assert await _take_up_and_leave(transport, group, topic) == 5
        reader = transport.consumer(group, [topic])
        try:
            committed = await reader.committed([tp])
        finally:
            await reader.close()
        assert committed[tp] == Position(tp, 2, "pl1:6-7")
    finally:
        await transport.close()


@pytest.mark.usefixtures("kafka_service")
async def test_a_kafka_partition_emptied_by_retention_is_counted_once(
    settings: Settings, unique: str
) -> None:
    """With every record gone, the next owner counts nothing again, commit metadata or not."""
    transport = KafkaTransport(settings)
    topic, group = f"empty_{unique}", f"g-{unique}"
    try:
        tp = await _committed_at_2(transport, group, topic, 10, "pl1:3")
        await expire_below(transport, settings, tp, 10)
        assert await _take_up_and_leave(transport, group, topic) == 8
        producer = transport.producer()
        await producer.send(topic, b"10", key=b"k", partition=0)
        await producer.close()
        before = lost_to_retention().get((topic, group), 0)
        second = transport.consumer(group, [topic])
        rest = await consume_until(second, lambda r: any(m.offset == 10 for m in r))
        await second.close()
        assert [m.offset for m in rest] == [10]
        assert lost_to_retention().get((topic, group), 0) - before == 0
    finally:
        await transport.close()
