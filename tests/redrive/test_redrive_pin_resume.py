"""A stopped ``--since`` redrive resumes its own window, whichever partitions it committed."""

from __future__ import annotations

import asyncio
import time

from redrive.helpers import HOUR_S, dead_letter_lane, keys_for, since_2h
from runtime.helpers import produce

from pipeline.envelope import Record
from pipeline.redrive.redrive import Redrive
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport


async def _four_moved(
    transport: Transport, unique: str
) -> tuple[TopicSpec, dict[str, bytes], tuple[bytes, bytes], float]:
    """Two dead letters on each of two partitions, moved by a ``--since 2h`` run at ``now``.

    Returns the lane, a dead letter's headers, a key of each partition and ``now``.
    """
    spec, dlq, headers = await dead_letter_lane(transport, unique, 2)
    (k0,), (k1,) = keys_for(0, 2, 1), keys_for(1, 2, 1)
    await produce(
        transport, dlq, [Record(b"a%d" % i, k, headers) for i in range(2) for k in (k0, k1)]
    )
    now = time.time()
    first = await asyncio.wait_for(Redrive(transport, dlq, since_2h(now)).run(), 60)
    assert first.moved == 4
    return spec, headers, (k0, k1), now


async def test_a_second_redrive_stopped_on_one_partition_resumes_its_window(
    transport: Transport, unique: str
) -> None:
    """The window resumed is the stopped run's, not the finished pin an untouched partition holds.

    Before, the run took the first pin found in partition order: partition 0, which the second
    run had nothing to read on, still held the first run's (finished), so the third run started
    a window of its own clock and passed the 7 left over as not selected (scanned 7, moved 0).
    """
    spec, headers, (_, k1), now = await _four_moved(transport, unique)
    dlq = spec.dead_letter
    await produce(transport, dlq, [Record(b"b%d" % i, k1, headers) for i in range(10)])
    second = await asyncio.wait_for(Redrive(transport, dlq, since_2h(now), limit=3).run(), 60)
    assert second.moved == 3
    later = now + 2.5 * HOUR_S
    dry = await asyncio.wait_for(Redrive(transport, dlq, since_2h(later), dry_run=True).run(), 60)
    assert (dry.scanned, dry.selected) == (7, 7)
    rest = await asyncio.wait_for(Redrive(transport, dlq, since_2h(later)).run(), 60)
    assert (rest.scanned, rest.selected, rest.moved) == (7, 7, 7)
    counts = await transport.admin().list_topics([spec.name])
    assert counts[spec.name].message_count == 14


async def test_a_run_stopped_on_the_other_partition_resumes_its_window_too(
    transport: Transport, unique: str
) -> None:
    """The stopped run's pin sits on partition 0 and the finished one on 1: the same answer.

    Then, with every window finished, the same command starts one of its own clock again.
    """
    spec, headers, (k0, k1), now = await _four_moved(transport, unique)
    dlq = spec.dead_letter
    await produce(transport, dlq, [Record(b"b%d" % i, k0, headers) for i in range(6)])
    second = await asyncio.wait_for(Redrive(transport, dlq, since_2h(now), limit=2).run(), 60)
    assert second.moved == 2
    later = now + 2.5 * HOUR_S
    rest = await asyncio.wait_for(Redrive(transport, dlq, since_2h(later)).run(), 60)
    assert (rest.scanned, rest.moved) == (4, 4)
    await produce(transport, dlq, [Record(b"c%d" % i, k1, headers) for i in range(3)])
    after = await asyncio.wait_for(Redrive(transport, dlq, since_2h(later)).run(), 60)
    assert (after.scanned, after.selected) == (3, 0)  # dead-lettered now, 0.5 h before its window
