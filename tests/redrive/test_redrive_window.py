"""A redrive with an age (``--since 2h``) resumed later selects what it set out to move."""

from __future__ import annotations

import asyncio
import time

from redrive.helpers import HOUR_S, dead_letter_lane, since_2h
from runtime.helpers import produce

from pipeline.envelope import Record
from pipeline.redrive.redrive import Redrive
from pipeline.transport.protocol import Transport


async def test_a_redrive_resumed_hours_later_moves_what_it_had_selected(
    transport: Transport, unique: str
) -> None:
    """The same `--since 2h` 2.5 h after it was stopped moves the rest; its dry run counts it.

    Before, the window moved with the clock of the run that resumed: the 7 dead letters the
    first run had selected and not reached were scanned, not selected and passed over for good.
    """
    spec, dlq, headers = await dead_letter_lane(transport, unique, 2)
    await produce(transport, dlq, [Record(b"v%d" % i, b"k", headers) for i in range(10)])
    now = time.time()
    first = await asyncio.wait_for(Redrive(transport, dlq, since_2h(now), limit=3).run(), 60)
    assert first.moved == 3
    later = now + 2.5 * HOUR_S
    dry = await asyncio.wait_for(Redrive(transport, dlq, since_2h(later), dry_run=True).run(), 60)
    assert (dry.scanned, dry.selected) == (7, 7)
    rest = await asyncio.wait_for(Redrive(transport, dlq, since_2h(later)).run(), 60)
    assert (rest.scanned, rest.moved) == (7, 7)
    counts = await transport.admin().list_topics([spec.name])
    assert counts[spec.name].message_count == 10


async def test_dead_letters_after_a_finished_redrive_are_judged_by_the_clock_of_now(
    transport: Transport, unique: str
) -> None:
    """The same command run after the redrive was done selects by its own window, not the old."""
    _, dlq, headers = await dead_letter_lane(transport, unique, 2)
    await produce(transport, dlq, [Record(b"old%d" % i, b"k", headers) for i in range(4)])
    now = time.time()
    done = await asyncio.wait_for(Redrive(transport, dlq, since_2h(now + 3 * HOUR_S)).run(), 60)
    assert (done.scanned, done.selected) == (4, 0)  # all older than its window
    await produce(transport, dlq, [Record(b"new%d" % i, b"k", headers) for i in range(5)])
    again = await asyncio.wait_for(Redrive(transport, dlq, since_2h(now)).run(), 60)
    assert (again.scanned, again.moved) == (5, 5)
