"""Dead letters that each fit their origin but not together on one partition move once each."""

from __future__ import annotations

import asyncio
import os

import pytest
from runtime.helpers import declare, lane_spec, produce

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.redrive.redrive import Redrive
from pipeline.redrive.select import Selection
from pipeline.transport.partitioner import partition_for
from pipeline.transport.protocol import TopicConfig, Transport


def _keys(partition: int, n: int) -> list[bytes]:
    """``n`` keys the transports place on ``partition`` of four."""
    return [b"k%d" % i for i in range(2_000) if partition_for(b"k%d" % i, 4) == partition][:n]


async def test_records_over_the_limit_together_on_one_partition_are_each_moved_once(
    transport: Transport, unique: str
) -> None:
    """Three 1,500-byte dead letters of one key, under an origin taking 3,000 bytes a batch.

    Before, librdkafka batched the three into one partition's request, which the broker
    refused while it took the six small ones of the other partitions; the whole send was then
    made again one record at a time, so those six were written twice (the origin held 15 for 9
    moved).
    """
    spec = lane_spec(f"rd_{unique}", 4)
    await declare(transport, spec)
    dlq = spec.dead_letter
    headers = {h.ORIGIN_TOPIC: spec.name.encode(), h.DEAD_REASON: b"fatal"}
    if transport.name == "kafka":
        await transport.admin().update_topic(
            TopicConfig(spec.name, 4, configs={"max.message.bytes": "3000"})
        )
    (same,) = _keys(0, 1)
    others = _keys(1, 2) + _keys(2, 2) + _keys(3, 2)
    records = [Record(os.urandom(1_500), same, headers, 0) for _ in range(3)]
    records += [Record(b"small%d" % i, key, headers, 0) for i, key in enumerate(others)]
    await produce(transport, dlq, records)  # one partition of the DLQ: one poll reads them all
    report = await asyncio.wait_for(Redrive(transport, dlq, Selection()).run(), 60)
    assert (report.scanned, report.moved, report.too_large) == (9, 9, 0)
    counts = await transport.admin().list_topics([spec.name])
    assert counts[spec.name].message_count == 9
    again = await asyncio.wait_for(Redrive(transport, dlq, Selection()).run(), 60)
    assert again.scanned == 0


@pytest.mark.parametrize("transport", ["kafka"], indirect=True)
async def test_a_partition_share_of_many_small_records_stays_under_the_limit(
    transport: Transport, unique: str
) -> None:
    """150 dead letters of 40 bytes on one partition: together well over an origin's 3,000 bytes."""
    spec = lane_spec(f"rd_{unique}", 4)
    await declare(transport, spec)
    dlq = spec.dead_letter
    headers = {h.ORIGIN_TOPIC: spec.name.encode(), h.DEAD_REASON: b"fatal"}
    await transport.admin().update_topic(
        TopicConfig(spec.name, 4, configs={"max.message.bytes": "3000"})
    )
    (same,) = _keys(2, 1)
    others = [Record(b"other%d" % i, key, headers, 0) for i, key in enumerate(_keys(3, 5))]
    records = [Record(os.urandom(40), same, headers, 0) for _ in range(150)]
    await produce(transport, dlq, [*others[:2], *records, *others[2:]])  # one poll reads them
    report = await asyncio.wait_for(Redrive(transport, dlq, Selection()).run(), 60)
    assert (report.moved, report.too_large) == (155, 0)
    counts = await transport.admin().list_topics([spec.name])
    assert counts[spec.name].message_count == 155
