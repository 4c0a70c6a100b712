"""A Redis DLQ partition's stream key overwritten while a redrive runs: nothing lost or doubled.

The redrive's member sets the partition aside (one line naming its key) and moves the others on;
the run then fails with one line naming the key, having committed what it moved. Once the key
is deleted, the same redrive moves the healthy partitions' remaining dead letters, none twice.
"""

from __future__ import annotations

import pytest
from redis import Redis as SyncRedis
from runtime.helpers import declare, lane_spec
from support import held_messages

from pipeline import headers as h
from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.errors import TransportError
from pipeline.redrive.redrive import Redrive
from pipeline.redrive.select import Selection
from pipeline.transport.protocol import Transport

PARTITIONS = 4
BAD = 1
PER_PARTITION = 4


async def test_a_key_overwritten_midway(
    streams: Transport, settings: Settings, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Partition 1 overwritten after the first batch: every healthy dead letter moved once."""
    spec = lane_spec(f"rdmid_{unique}", PARTITIONS)
    await declare(streams, spec)
    dlq = spec.dead_letter
    producer = streams.producer()
    try:
        for p in range(PARTITIONS):
            await producer.send_many(
                dlq,
                [
                    Record(
                        b"d",
                        b"k",
                        {h.ORIGIN_TOPIC: spec.name.encode(), h.EVENT_ID: b"e-%d-%d" % (p, i)},
                        partition=p,
                    )
                    for i in range(PER_PARTITION)
                ],
            )
    finally:
        await producer.close()
    stream = f"{{{settings.redis.key_prefix}:{dlq}:{BAD}}}:s"
    sync = SyncRedis.from_url(settings.redis.url)
    batches: list[int] = []

    def progress(handled: int) -> None:
        batches.append(handled)
        if len(batches) == 1:
            sync.set(stream, b"not a stream")

    first = Redrive(streams, dlq, Selection.typed_as(), rate_per_s=4)  # batches of 4
    try:
        with pytest.raises(TransportError) as failed:
            await first.run(progress)
        sync.delete(stream)  # as the line says
    finally:
        sync.close()
    assert f"`redis-cli DEL {stream}`" in str(failed.value), failed.value
    member_lines = [r.getMessage() for r in caplog.records if stream in r.getMessage()]
    assert member_lines, "the member named the key it set aside"
    second = await Redrive(streams, dlq, Selection.typed_as()).run()
    ids = [m.headers[h.EVENT_ID] for m in await held_messages(streams, spec.name)]
    assert len(ids) == len(set(ids)), sorted(ids)  # none twice
    assert first.report.moved + second.moved == len(ids)
    healthy = {b"e-%d-%d" % (p, i) for p in range(PARTITIONS) if p != BAD for i in range(4)}
    assert healthy <= set(ids), sorted(ids)  # none of the healthy partitions lost
