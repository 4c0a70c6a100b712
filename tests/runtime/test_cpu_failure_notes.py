"""A CPU worker's note on a failure: one per failure, and read at each level of a group.

The worker adds the handler's traceback to the exception it sends back as a note
(:func:`~pipeline.runtime.failure_log.worker_note`). Before:

* the note went on the app's own object: a module-level instance raised each time gained a
  note per failure in the worker, each sent back with all the earlier ones (29 notes, 70 kB,
  after 30 failures);
* an ExceptionGroup's place was read from its first sub-exception only, which comes back from
  the worker without traceback or note: every group of a CPU lane was placed at ``?``, so a
  group of a ValueError raised in one function held back one raised in another.
"""

from __future__ import annotations

import logging

import pytest
from redis.asyncio import Redis
from runtime import cpu_noted_app
from runtime.failure_helpers import FAILURES, cpu_lane_dead_lettered, logged, past_position

from pipeline.envelope import Record
from pipeline.runtime.cpu import ProcessPool, function_ref
from pipeline.transport.protocol import Transport

LOGGER = FAILURES


def _worker_notes(error: BaseException) -> list[str]:
    """The CPU workers' notes on ``error``."""
    return [n for n in getattr(error, "__notes__", []) if n.startswith("CPU worker ")]


async def test_an_instance_raised_again_comes_back_with_one_note_each_time() -> None:
    """Three failures of one worker raising one module-level instance: one note on each."""
    pool = ProcessPool(1, grace_s=1.0)
    try:
        counts = []
        for _ in range(3):
            with pytest.raises(cpu_noted_app.Reused) as raised:
                await pool.run(function_ref(cpu_noted_app.crunch), (b"r", None), 60)
            counts.append(len(_worker_notes(raised.value)))
            assert "raised in crunch (" in _worker_notes(raised.value)[0].splitlines()[0]
    finally:
        await pool.close()
    assert counts == [1, 1, 1]


async def test_groups_of_a_cpu_lane_are_placed_by_the_workers_note(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Groups of a ValueError raised in two functions are two lines, neither held back."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    records = [Record(b"ga", b"k-1"), Record(b"gb", b"k-2")]  # each failure dead-letters
    spec = await cpu_lane_dead_lettered(
        streams, redis, unique, f"cn_{unique}", cpu_noted_app.crunch, records, 120
    )
    heads = [past_position(r) for r in logged(caplog, LOGGER)]
    # Two keys of an unordered lane run side by side: their lines come in either order.
    assert sorted(heads) == [
        (
            f"ExceptionGroup: the crunch failed (1 sub-exception) (first: ValueError: leaf {x}"
            f" b'g{x}'); next: dead letter (exhausted)"
            f" (inspect: pipeline redrive {spec.dead_letter} --dry-run)"
        )
        for x in "ab"
    ]
