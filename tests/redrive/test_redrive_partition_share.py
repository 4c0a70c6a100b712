"""Dead letters that each fit their origin but not together on one partition move once each."""

from __future__ import annotations

import asyncio
import os

import pytest
from redrive.helpers import dead_letter_lane, keys_for
from runtime.helpers import produce

from pipeline.envelope import Record
from pipeline.redrive.redrive import Redrive
from pipeline.redrive.select import Selection
from pipeline.transport.protocol import TopicConfig, Transport


async def test_records_over_the_limit_together_on_one_partition_are_each_moved_once(
    transport: Transport, unique: str
) -> None:
    """Three 1,500-byte dead letters of one key, under an origin taking 3,000 bytes a batch.

    Before, librdkafka batched the three into one partition's request, which the broker
    refused while it took the six small ones of the other partitions; the whole send was then
    made again one record at a time, so those six were written twice (the origin held 15 for 9
    moved).
    """
    spec, dlq, headers = await dead_letter_lane(transport, unique, 4)
    if transport.name == "kafka":
        await transport.admin().update_topic(
            TopicConfig(spec.name, 4, configs={"max.message.bytes": "3000"})
        )
    (same,) = keys_for(0, 4, 1)
    others = keys_for(1, 4, 2) + keys_for(2, 4, 2) + keys_for(3, 4, 2)
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
    spec, dlq, headers = await dead_letter_lane(transport, unique, 4)
    await transport.admin().update_topic(
        TopicConfig(spec.name, 4, configs={"max.message.bytes": "3000"})
    )
    (same,) = keys_for(2, 4, 1)
    others = [Record(b"other%d" % i, key, headers, 0) for i, key in enumerate(keys_for(3, 4, 5))]
    records = [Record(os.urandom(40), same, headers, 0) for _ in range(150)]
    await produce(transport, dlq, [*others[:2], *records, *others[2:]])  # one poll reads them
    report = await asyncio.wait_for(Redrive(transport, dlq, Selection()).run(), 60)
    assert (report.moved, report.too_large) == (155, 0)
    counts = await transport.admin().list_topics([spec.name])
    assert counts[spec.name].message_count == 155
