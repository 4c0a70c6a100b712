"""Kafka admin details that the transport contract does not cover."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition as RawTP
from confluent_kafka.admin import OffsetSpec
from contract.helpers import make_topic, wait_for

from pipeline.config import Settings
from pipeline.envelope import TopicPartition
from pipeline.errors import GroupNotEmpty, TransportError
from pipeline.transport import create_transport
from pipeline.transport.kafka.admin import KafkaAdmin
from pipeline.transport.protocol import Consumer, Transport


async def test_offsets_of_a_topic_deleted_meanwhile_are_skipped_only_when_asked(
    kafka: Transport, unique: str
) -> None:
    """Listing topics tolerates a topic that vanished after the metadata was read."""
    admin = kafka.admin()
    gone = [RawTP(f"gone_{unique}", 0)]
    assert await admin._offsets(gone, OffsetSpec.latest(), skip_gone=True) == {}  # type: ignore[attr-defined]
    with pytest.raises(TransportError):
        await admin._offsets(gone, OffsetSpec.latest())  # type: ignore[attr-defined]


async def test_a_group_with_a_live_member_is_not_deleted_and_says_why(
    kafka: Transport, unique: str
) -> None:
    """Deleting a group that still has a member fails with GroupNotEmpty; once it left, it works."""
    admin = kafka.admin()
    topic, group = f"busy_{unique}", f"g-{unique}"
    await make_topic(kafka, topic, 1)
    consumer = kafka.consumer(group, [topic])
    try:
        await wait_for(lambda: _assigned(consumer))
        with pytest.raises(GroupNotEmpty, match=f"{group}.*still has members"):
            await admin.delete_group(group, [topic])
    finally:
        await consumer.close()
    await admin.delete_group(group, [topic])
    listed = admin._raw.list_consumer_groups(request_timeout=10).result().valid  # type: ignore[attr-defined]
    assert group not in {g.group_id for g in listed}


async def _assigned(consumer: Consumer) -> bool:
    await consumer.poll(1, 0.2)
    return bool(consumer.assignment())


class _Leaderless:
    """An AdminClient whose partitions answer "no leader" a set number of times, then offsets.

    A real broker answers so only for a moment (a topic being created or deleted by another
    client), which no test can hold open on demand; the admin's handling of it is what is tested.
    """

    def __init__(self, refusals: dict[tuple[str, int], int]) -> None:
        self.refusals = refusals
        self.requests: list[list[tuple[str, int]]] = []

    def list_offsets(self, request: dict[RawTP, object], **_: object) -> dict:
        self.requests.append([(tp.topic, tp.partition) for tp in request])
        futures = {}
        for tp in request:
            future: Future[object] = Future()
            left = self.refusals.get((tp.topic, tp.partition), 0)
            if left:
                self.refusals[(tp.topic, tp.partition)] = left - 1
                future.set_exception(
                    KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
                )
            else:
                future.set_result(SimpleNamespace(offset=7))
            futures[tp] = future
        return futures


async def test_a_partition_without_a_leader_is_asked_again_then_counts_as_gone(
    settings: Settings,
) -> None:
    """A leaderless partition is asked again alone; one that stays so fails, or is skipped."""
    admin = KafkaAdmin(settings.kafka)
    tps = [RawTP("moving", 0), RawTP("moving", 1), RawTP("still", 0)]
    raw = _Leaderless({("moving", 1): 2})
    admin._raw = raw
    got = await admin._offsets(tps, OffsetSpec.latest())
    assert got == {TopicPartition(t.topic, t.partition): 7 for t in tps}
    first = [("moving", 0), ("moving", 1), ("still", 0)]
    assert raw.requests == [first, [("moving", 1)], [("moving", 1)]]  # asked again alone

    raw = _Leaderless({("moving", 1): 100})
    admin._raw = raw
    with pytest.raises(TransportError, match="list offsets of moving"):
        await admin._offsets(tps, OffsetSpec.latest())
    raw = _Leaderless({("moving", 1): 100})
    admin._raw = raw
    got = await admin._offsets(tps, OffsetSpec.latest(), skip_gone=True)
    assert set(got) == {TopicPartition("moving", 0), TopicPartition("still", 0)}
    assert len(raw.requests) == 6  # the first and five more, 1.5 s of pauses in all


async def test_a_lag_read_of_a_deep_backlog_finds_each_partitions_oldest_waiting_record(
    settings: Settings, kafka: Transport, unique: str
) -> None:
    """Four partitions of 2 MiB each: the timestamp at every committed position, exactly.

    The read takes one record a partition, its prefetch capped at 1 MiB (``_ONE_RECORD``): the
    partitions the cap holds back must still each give their own first waiting record.
    """
    topic, group = f"backlog_{unique}", f"g-{unique}"
    await make_topic(kafka, topic, 4)
    base = 1_700_000_000_000
    # Idempotent, so a batch the broker makes the producer send again still lands before the
    # batches behind it: a partition's timestamps then rise with its offsets, which is what the
    # expected figures below assume.
    raw = RawProducer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "linger.ms": 20,
            "enable.idempotence": True,
        }
    )
    value = b"v" * 2048
    for p in range(4):
        for i in range(1024):
            raw.produce(topic, value, partition=p, timestamp=base + p * 100_000 + i)
        assert raw.flush(30) == 0, f"partition {p}: records still unsent after 30 s"
    committed = {0: 0, 1: 10, 2: 500, 3: 1023}
    group_client = RawConsumer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": group}
    )
    try:
        group_client.commit(
            offsets=[RawTP(topic, p, offset) for p, offset in committed.items()],
            asynchronous=False,
        )
    finally:
        group_client.close()
    admin = kafka.admin()
    try:
        lag = await admin.group_lag(group, topic)
    finally:
        await admin.delete_group(group, [topic])
        await admin.delete_topic(topic)
    assert {p.tp.partition: p.committed for p in lag} == committed
    assert {p.tp.partition: p.lag for p in lag} == {p: 1024 - o for p, o in committed.items()}
    oldest = {p.tp.partition: p.oldest_unconsumed_ms for p in lag}
    assert oldest == {p: base + p * 100_000 + o for p, o in committed.items()}


async def test_a_lag_read_works_with_a_poll_interval_below_librdkafkas_session_default(
    settings: Settings, kafka_service: str, unique: str
) -> None:
    """A max.poll.interval.ms the members accept (above their session) fails no lag read."""
    kafka = settings.kafka.model_copy(
        update={"session_timeout_ms": 6000, "client": {"max.poll.interval.ms": "8000"}}
    )
    transport = create_transport(settings.model_copy(update={"kafka": kafka}), "kafka")
    topic = f"lag_{unique}"
    await make_topic(transport, topic, 1)
    producer = transport.producer()
    await producer.send(topic, b"waiting")
    await producer.close()
    try:
        (lag,) = await transport.admin().group_lag(f"g-{unique}", topic)
    finally:
        await transport.close()
    assert (lag.committed, lag.lag) == (None, 1)
    assert lag.oldest_unconsumed_ms is not None  # the waiting record was read
