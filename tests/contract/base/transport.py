"""The transport contract: one body of tests every Transport passes on its real broker.

Subclassed per transport in ``test_kafka.py``, ``test_redis_streams.py`` and ``test_memory.py``.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections import defaultdict
from typing import ClassVar

import pytest
from contract.helpers import RecordingListener, consume_until, make_topic, unreachable, wait_for
from contract.members import start_member

from pipeline.config import Settings
from pipeline.envelope import Delivered, Message, Position, Record, TopicPartition
from pipeline.errors import BrokerUnavailable, MessageTooLarge, TransportError, UnknownTopic
from pipeline.transport.partitioner import partition_for
from pipeline.transport.protocol import Consumer, TopicConfig, Transport


async def produce_keyed(
    transport: Transport, topic: str, n: int, keys: int
) -> list[tuple[bytes, bytes, Delivered]]:
    """Produce ``n`` messages over ``keys`` keys; returns (key, value, receipt) in produce order."""
    producer = transport.producer()
    sent = [(f"key-{i % keys}".encode(), f"{i}".encode()) for i in range(n)]
    receipts = await asyncio.gather(*(producer.send(topic, v, key=k) for k, v in sent))
    await producer.close()
    return [(k, v, d) for (k, v), d in zip(sent, receipts, strict=True)]


async def _polls_until_assigned(consumer: Consumer) -> bool:
    await consumer.poll(10, 0.2)
    return 0 < len(consumer.assignment()) < 4


async def _polls_until_owning(consumer: Consumer, n: int) -> bool:
    await consumer.poll(10, 0.2)
    return len(consumer.assignment()) == n


async def _poll_repeatedly(consumer: Consumer, times: int) -> None:
    for _ in range(times):
        await consumer.poll(1, 0.5)


class TransportContract:
    """The Transport protocol's contract; a subclass per transport names it in ``kind``."""

    kind: ClassVar[str]

    async def test_keyed_messages_land_on_the_java_partition(
        self, transport: Transport, unique: str
    ) -> None:
        """A keyed message lands on toPositive(murmur2(key)) % partitions, as in a Java client."""
        topic = f"t-{unique}"
        await make_topic(transport, topic, 7)
        producer = transport.producer()
        for i in range(40):
            key = f"customer-{i}".encode()
            delivered = await producer.send(topic, b"x", key=key)
            assert delivered.partition == partition_for(key, 7)
            assert delivered.topic == topic
        await producer.close()

    async def test_per_key_order_is_kept(self, transport: Transport, unique: str) -> None:
        """Messages of one key are consumed in the order they were produced."""
        topic = f"t-{unique}"
        await make_topic(transport, topic, 4)
        sent = await produce_keyed(transport, topic, 400, keys=25)
        consumer = transport.consumer(f"g-{unique}", [topic])
        got = await consume_until(consumer, lambda r: len(r) >= len(sent))
        await consumer.close()
        by_key: dict[bytes | None, list[bytes]] = defaultdict(list)
        offsets: dict[int, list[int]] = defaultdict(list)
        for msg in got:
            by_key[msg.key].append(msg.value)
            offsets[msg.partition].append(msg.offset)
        expected: dict[bytes, list[bytes]] = defaultdict(list)
        for key, value, _ in sent:
            expected[key].append(value)
        assert by_key == expected
        assert all(o == sorted(o) for o in offsets.values())

    async def test_two_members_split_the_partitions(
        self, transport: Transport, unique: str
    ) -> None:
        """A group of two shares the partitions: disjoint assignments that cover every partition."""
        topic, group = f"t-{unique}", f"g-{unique}"
        await make_topic(transport, topic, 6)
        await produce_keyed(transport, topic, 300, keys=60)
        a = transport.consumer(group, [topic])
        b = transport.consumer(group, [topic])
        received: dict[str, list[Message]] = {"a": [], "b": []}

        async def both_hold_partitions() -> bool:
            received["a"] += await a.poll(100, 0.2)
            received["b"] += await b.poll(100, 0.2)
            return (
                bool(a.assignment())
                and bool(b.assignment())
                and (len(a.assignment() | b.assignment()) == 6)
            )

        await wait_for(both_hold_partitions, timeout_s=60)
        assert not a.assignment() & b.assignment()
        assert {tp.partition for tp in a.assignment() | b.assignment()} == set(range(6))
        await a.close()
        await b.close()

    async def test_killed_member_is_replaced_and_nothing_is_lost(
        self, transport: Transport, unique: str
    ) -> None:
        """After kill -9 of one member the other takes over; every message arrives at least once."""
        topic, group = f"t-{unique}", f"g-{unique}"
        await make_topic(transport, topic, 4)
        victim = start_member(transport, group, topic, "commit")
        survivor = transport.consumer(group, [topic])
        try:
            # Both members must hold partitions before the load, so the victim really has work.
            await wait_for(lambda: _polls_until_assigned(survivor), timeout_s=60)
            sent = await produce_keyed(transport, topic, 600, keys=40)
            produced = {(d.partition, d.offset) for _, _, d in sent}
            seen_by_victim: set[tuple[int, int]] = set()
            first = await victim.read()
            seen_by_victim.add((int(str(first["p"])), int(str(first["o"]))))
            for row in await victim.kill():
                seen_by_victim.add((int(str(row["p"])), int(str(row["o"]))))
            # Messages produced after the kill can only reach the survivor once it has taken over.
            later = await produce_keyed(transport, topic, 200, keys=40)
            produced |= {(d.partition, d.offset) for _, _, d in later}
            got = await consume_until(
                survivor,
                lambda r: seen_by_victim | {(m.partition, m.offset) for m in r} >= produced,
                timeout_s=90,
            )
            assert survivor.assignment() == {TopicPartition(topic, p) for p in range(4)}
            assert {(m.partition, m.offset) for m in got} | seen_by_victim == produced
        finally:
            victim.reap()
            await survivor.close()

    async def test_uncommitted_messages_are_redelivered_after_a_crash(
        self, transport: Transport, unique: str
    ) -> None:
        """A crashed member's committed messages are not redelivered and all the others are."""
        topic, group = f"t-{unique}", f"g-{unique}"
        await make_topic(transport, topic, 3)
        sent = await produce_keyed(transport, topic, 300, keys=30)
        produced = {(d.partition, d.offset) for _, _, d in sent}
        victim = start_member(transport, group, topic, "hold", EXPECT=str(len(sent)))
        try:
            holding = await victim.read()
            committed = {int(p): o for p, o in holding["holding"].items()}  # type: ignore[attr-defined]
        finally:
            await victim.kill()
        expected = {(p, o) for p, o in produced if o >= committed[p]}
        successor = transport.consumer(group, [topic])
        got = await consume_until(
            successor, lambda r: {(m.partition, m.offset) for m in r} >= expected, timeout_s=90
        )
        await successor.close()
        assert {(m.partition, m.offset) for m in got} == expected
        if transport.name in ("redis", "memory"):
            assert all(m.delivery_count == 2 for m in got), (
                "reclaimed entries count both deliveries"
            )

    async def test_pause_and_resume(self, transport: Transport, unique: str) -> None:
        """A paused partition yields nothing until it is resumed; the others keep flowing."""
        topic = f"t-{unique}"
        await make_topic(transport, topic, 2)
        consumer = transport.consumer(f"g-{unique}", [topic])
        await wait_for(lambda: _polls_until_owning(consumer, 2), timeout_s=60)
        paused = TopicPartition(topic, 0)
        consumer.pause([paused])
        producer = transport.producer()
        for p in (0, 1):
            for i in range(20):
                await producer.send(topic, f"{p}-{i}".encode(), partition=p)
        await producer.close()
        flowing = await consume_until(consumer, lambda r: len(r) >= 20)
        assert {m.partition for m in flowing} == {1}
        consumer.resume([paused])
        resumed = await consume_until(consumer, lambda r: len(r) >= 20)
        assert {m.partition for m in resumed} == {0}
        assert [m.value for m in resumed] == [f"0-{i}".encode() for i in range(20)]
        await consumer.close()

    async def test_headers_and_a_one_mebibyte_payload_survive(
        self, transport: Transport, unique: str
    ) -> None:
        """A 1 MiB value and its headers come back byte for byte."""
        topic = f"t-{unique}"
        await make_topic(transport, topic, 1)
        value = os.urandom(1_048_576)
        headers = {"tenant": b"acme", "event-id": b"evt-1", "binary": bytes(range(256))}
        producer = transport.producer()
        await producer.send(topic, value, key=b"k", headers=headers)
        await producer.close()
        consumer = transport.consumer(f"g-{unique}", [topic])
        (msg,) = await consume_until(consumer, lambda r: len(r) >= 1)
        await consumer.close()
        assert msg.value == value
        assert msg.headers == headers
        assert msg.key == b"k"
        assert msg.timestamp_ms > 0

    async def test_oversized_message_is_refused(self, transport: Transport, unique: str) -> None:
        """A message above max_message_bytes fails with MessageTooLarge."""
        topic = f"t-{unique}"
        await make_topic(transport, topic, 1)
        producer = transport.producer()
        with pytest.raises(MessageTooLarge, match="exceeds max_message_bytes"):
            await producer.send(topic, b"x" * 3_000_000)
        await producer.close()

    async def test_a_batch_holding_an_oversized_message_is_refused_whole(
        self, transport: Transport, unique: str
    ) -> None:
        """send_many with one message above max_message_bytes produces none of the batch."""
        # The ingress's republish relies on it: it then sends the batch one by one to find the
        # culprit, so messages already produced by the refused batch would be produced twice.
        topic = f"t-{unique}"
        await make_topic(transport, topic, 1)
        producer = transport.producer()
        batch = [Record(b"before"), Record(b"x" * 3_000_000), Record(b"after")]
        with pytest.raises(MessageTooLarge, match="exceeds max_message_bytes"):
            await producer.send_many(topic, batch)
        await producer.close()
        assert (await transport.admin().list_topics([topic]))[topic].message_count == 0

    async def test_unknown_topic_is_a_clear_error(self, transport: Transport, unique: str) -> None:
        """Producing to or consuming from an undeclared topic raises UnknownTopic."""
        producer = transport.producer()
        with pytest.raises(UnknownTopic, match="topics apply"):
            await producer.send(f"missing-{unique}", b"x")
        await producer.close()
        consumer = transport.consumer(f"g-{unique}", [f"missing-{unique}"])
        with pytest.raises(UnknownTopic):
            await _poll_repeatedly(consumer, times=20)
        await consumer.close()

    async def test_unreachable_broker_fails_fast(
        self, settings: Settings, transport: Transport
    ) -> None:
        """A broker that does not answer gives BrokerUnavailable within the request timeout."""
        dead = settings.model_copy(
            update={
                "kafka": settings.kafka.model_copy(
                    update={"bootstrap_servers": "127.0.0.1:1", "request_timeout_ms": 1000}
                ),
                "redis": settings.redis.model_copy(
                    update={"url": "redis://127.0.0.1:1/0", "socket_timeout_s": 1.0}
                ),
            }
        )
        broken = unreachable(dead, transport)
        producer = broken.producer()
        with pytest.raises(BrokerUnavailable):
            await asyncio.wait_for(producer.send("anything", b"x"), 30)
        await producer.close()
        await broken.close()

    async def test_admin_reports_topics_and_group_lag(
        self, transport: Transport, unique: str
    ) -> None:
        """Admin lists topics, grows (never shrinks) partitions, reports lag and oldest age."""
        topic, group = f"t-{unique}", f"g-{unique}"
        await make_topic(transport, topic, 2)
        admin = transport.admin()
        sent = await produce_keyed(transport, topic, 50, keys=10)
        info = (await admin.list_topics())[topic]
        assert info.partitions == 2
        assert info.message_count == 50
        assert await admin.list_topics([topic, f"absent-{unique}"]) == {topic: info}
        lag = await admin.group_lag(group, topic)
        assert sum(p.lag for p in lag) == 50
        first_ts = {p.tp: p.oldest_unconsumed_ms for p in lag if p.end}
        assert all(ts is not None and ts > 0 for ts in first_ts.values())
        consumer = transport.consumer(group, [topic])
        await consume_until(consumer, lambda r: len(r) >= len(sent))
        await consumer.close()
        lag = await admin.group_lag(group, topic)
        assert sum(p.lag for p in lag) == 0
        assert all(p.oldest_unconsumed_ms is None for p in lag)
        await admin.update_topic(TopicConfig(topic, 3, retention_ms=3_600_000))
        grown = (await admin.list_topics())[topic]
        assert grown.partitions == 3
        assert grown.retention_ms == 3_600_000
        with pytest.raises(TransportError, match=f"{topic}.*3 partitions.*cannot shrink.*to 2"):
            await admin.update_topic(TopicConfig(topic, 2))
        assert (await admin.list_topics())[topic].partitions == 3
        await admin.delete_topic(topic)
        assert topic not in await admin.list_topics()

    async def test_delete_group_forgets_positions_and_a_missing_group_is_no_error(
        self, transport: Transport, unique: str
    ) -> None:
        """A deleted group's positions and delivery counts are gone; deleting again is no error."""
        topic, group = f"t-{unique}", f"g-{unique}"
        await make_topic(transport, topic, 2)
        sent = await produce_keyed(transport, topic, 10, keys=4)
        consumer = transport.consumer(group, [topic])
        await consume_until(consumer, lambda r: len(r) >= len(sent))
        await consumer.close()
        admin = transport.admin()
        assert sum(p.lag for p in await admin.group_lag(group, topic)) == 0
        await admin.delete_group(group, [topic])
        lag = await admin.group_lag(group, topic)
        assert [p.committed for p in lag] == [None, None]
        assert sum(p.lag for p in lag) == 10
        again = transport.consumer(group, [topic])
        reread = await consume_until(again, lambda r: len(r) >= len(sent))
        await again.close()
        assert {m.delivery_count for m in reread} == {1}
        await admin.delete_group(group, [topic])
        await admin.delete_group(group, [topic])
        await admin.delete_topic(topic)
        await admin.delete_group(group, [topic])

    async def test_send_many_keeps_order_and_returns_receipts(
        self, transport: Transport, unique: str
    ) -> None:
        """A batch is produced in order, each record on its key's partition, one receipt each."""
        topic = f"t-{unique}"
        await make_topic(transport, topic, 3)
        producer = transport.producer()
        records = [
            Record(f"{i}".encode(), f"k{i % 7}".encode(), {"i": b"%d" % i}) for i in range(500)
        ]
        receipts = await producer.send_many(topic, records)
        await producer.close()
        assert [d.partition for d in receipts] == [partition_for(r.key or b"", 3) for r in records]
        per_partition: dict[int, list[int]] = defaultdict(list)
        for d in receipts:
            per_partition[d.partition].append(d.offset)
        assert all(offs == list(range(len(offs))) for offs in per_partition.values())
        consumer = transport.consumer(f"g-{unique}", [topic])
        got = await consume_until(consumer, lambda r: len(r) >= len(records))
        await consumer.close()
        by_offset = {(m.partition, m.offset): m for m in got}
        for record, receipt in zip(records, receipts, strict=True):
            msg = by_offset[receipt.partition, receipt.offset]
            assert (msg.key, msg.value, msg.headers) == (record.key, record.value, record.headers)

    async def test_listener_commits_on_revocation_and_sees_metadata_on_assignment(
        self, transport: Transport, unique: str
    ) -> None:
        """Positions on_revoked returns are committed; the next member gets them with metadata."""
        topic, group = f"t-{unique}", f"g-{unique}"
        await make_topic(transport, topic, 2)
        tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
        for p in (0, 1):
            producer = transport.producer()
            await producer.send_many(topic, [Record(b"x", partition=p) for _ in range(10)])
            await producer.close()
        first = RecordingListener([Position(tp0, 4, "pl1:2"), Position(tp1, 7, "")])
        consumer = transport.consumer(group, [topic], listener=first)
        await consume_until(consumer, lambda r: len(r) >= 20, commit=False)
        assert sorted(first.assigned) == [tp0, tp1]
        await consumer.close()
        assert sorted(first.revoked) == [(tp0, False), (tp1, False)]
        second = RecordingListener()
        successor = transport.consumer(group, [topic], listener=second)
        rest = await consume_until(successor, lambda r: len(r) >= 6 + 3, commit=False)
        await successor.close()
        assert second.committed[tp0] == Position(tp0, 4, "pl1:2")
        assert second.committed[tp1].offset == 7
        assert sorted((m.partition, m.offset) for m in rest) == [
            *((0, o) for o in range(4, 10)),
            *((1, o) for o in range(7, 10)),
        ]

    async def test_a_recreated_topic_has_no_committed_positions_of_the_deleted_one(
        self, transport: Transport, unique: str
    ) -> None:
        """After delete and create, the group has no position there; its lag is the new messages."""
        # Kafka forgets the offsets groups committed on a deleted topic. A group that kept them
        # would take the new topic's first messages (their offsets start at 0 again) for ones
        # it had already done: the runtime skips offsets below the committed position.
        topic, group = f"recreated_{unique}", f"g-{unique}"
        tp = TopicPartition(topic, 0)
        await make_topic(transport, topic, 1)
        admin = transport.admin()
        try:
            producer = transport.producer()
            for i in range(5):
                await producer.send(topic, b"old-%d" % i, partition=0)
            reader = transport.consumer(group, [topic])
            await consume_until(reader, lambda r: len(r) >= 5)
            await reader.close()
            (before,) = await admin.group_lag(group, topic)
            assert before.committed == 5

            await admin.delete_topic(topic)
            await admin.create_topic(TopicConfig(topic, 1))
            for i in range(3):
                await producer.send(topic, b"new-%d" % i, partition=0)
            await producer.close()

            (after,) = await admin.group_lag(group, topic)
            assert (after.committed, after.end, after.lag) == (None, 3, 3)
            successor = transport.consumer(group, [topic])
            assert await successor.committed([tp]) == {}
            got = await consume_until(successor, lambda r: len(r) >= 3)
            await successor.close()
            assert [(m.value, m.delivery_count) for m in got] == [
                (b"new-0", 1),
                (b"new-1", 1),
                (b"new-2", 1),
            ]
        finally:
            await admin.delete_group(group, [topic])

    async def test_a_commit_for_a_partition_no_longer_owned_leaves_its_position(
        self, transport: Transport, unique: str
    ) -> None:
        """A partition moved with position 8: its former owner's commit of 2 changes nothing."""
        # The runtime computes a commit's positions before it sends them; a rebalance in between
        # gives the partition to another member, after the revocation committed a later
        # position. The stale commit must not move the new owner's position back (its messages
        # would run again).
        topic, group = f"stale_{unique}", f"g-{unique}"
        await make_topic(transport, topic, 2)
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        producer = transport.producer()
        for tp in tps:
            await producer.send_many(topic, [Record(b"x", partition=tp.partition)] * 10)
        await producer.close()
        first = transport.consumer(
            group, [topic], listener=RecordingListener([Position(tp, 8) for tp in tps])
        )
        second = transport.consumer(group, [topic])
        try:

            async def first_owns_both() -> bool:
                await first.poll(10, 0.2)
                return len(first.assignment()) == 2

            async def shared() -> bool:
                await asyncio.gather(first.poll(10, 0.2), second.poll(10, 0.2))
                return len(first.assignment()) == len(second.assignment()) == 1

            await wait_for(first_owns_both, timeout_s=60)
            await wait_for(shared, timeout_s=60)
            (moved,) = second.assignment()
            assert await second.committed([moved]) == {moved: Position(moved, 8)}

            await first.commit([Position(moved, 2)])

            assert await second.committed([moved]) == {moved: Position(moved, 8)}
        finally:
            await first.close()
            await second.close()
            await transport.admin().delete_group(group, [topic])

    @pytest.mark.parametrize("partition", [3, -1])
    async def test_a_partition_the_topic_lacks_refuses_the_whole_call(
        self, transport: Transport, unique: str, partition: int
    ) -> None:
        """A send or batch naming a partition the topic lacks raises UnknownTopic and sends none."""
        topic = f"t-{unique}"
        await make_topic(transport, topic, 3)
        producer = transport.producer()
        message = re.escape(f"topic {topic!r} has no partition {partition} (it has 3: 0 to 2)")
        with pytest.raises(UnknownTopic, match=message):
            await producer.send(topic, b"x", partition=partition)
        batch = [Record(b"before", partition=0), Record(b"x", partition=partition), Record(b"z")]
        with pytest.raises(UnknownTopic, match=message):
            await producer.send_many(topic, batch)
        await producer.close()
        assert (await transport.admin().list_topics([topic]))[topic].message_count == 0

    async def test_deleting_a_topic_that_does_not_exist_is_unknown_topic(
        self, transport: Transport, unique: str
    ) -> None:
        """Admin.delete_topic of a topic the broker does not have raises UnknownTopic."""
        with pytest.raises(UnknownTopic, match=f"missing-{unique}"):
            await transport.admin().delete_topic(f"missing-{unique}")
