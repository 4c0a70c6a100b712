"""A dead letter produced is told by a WARNING, whatever becomes of its turn's later ones.

A handler stage on Redis Streams reports through
:class:`~pipeline.runtime.progress.DeadLetterWarnings`, as ``pipeline consume`` does. A turn of
3 messages that failed for good is dead-lettered message by message; the broker refuses the
second (the member stopping: no broker retries), so the turn is not routed and runs again.
Before, message @0 was in the DLQ and no WARNING told it: its warning was left out for the
turn's line, which said ``not routed``, and dropped once routing ended.

The warnings left out are given one by one: one that fails neither skips the others nor takes
the place of the ``CancelledError`` that ended the routing.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from runtime.failure_helpers import (
    DEAD_LETTERS,
    FAILURES,
    SecondSendAmiss,
    failed_turn,
    first_lines,
    hand_settled,
    raised,
    routing_stage,
    warnings_of,
)
from runtime.helpers import the_dead_letter

from pipeline.errors import TransportError
from pipeline.runtime.failure_log import FailureLog, told
from pipeline.transport.protocol import Transport


class _RefusingSecond(SecondSendAmiss):
    """The transport's producer, but the broker refuses its second send."""

    async def second(self) -> None:
        """The broker refuses the send."""
        raise TransportError("the broker refused the send")


async def test_a_turn_whose_later_dead_letter_is_refused_warns_of_the_one_produced(
    streams: Transport, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """3 messages, the 2nd refused: the turn's line says not routed, @0 has its own WARNING."""
    caplog.set_level(logging.WARNING)
    spec, app = await hand_settled(streams, f"pd_{unique}")
    producer = streams.producer()
    try:
        refusing = _RefusingSecond(producer).as_producer()
        # a member stopping: the refused send is not tried again
        stage = routing_stage(app, spec.lane, refusing, warnings_of(spec), stopping=True)
        turn = failed_turn(spec.name, 3, raised())
        settled = await stage.settle_turn(app.lanes[spec.lane], turn)
    finally:
        await producer.close()

    assert not settled  # it runs again
    (dead,) = [await the_dead_letter(streams, spec, unique)]
    assert dead.value == b"said 0"
    (failure,) = first_lines(caplog, FAILURES)
    assert failure.endswith("next: not routed, run again after backoff"), failure
    assert first_lines(caplog, DEAD_LETTERS) == [
        (
            f"dead letter on lane {spec.lane}: exhausted: RuntimeError: the model timed out"
            f" (inspect: pipeline redrive {spec.dead_letter} --dry-run)"
        )
    ]


async def test_a_failing_warning_skips_no_other_and_the_cancel_goes_on() -> None:
    """Two warnings left out, the first raising, the routing cancelled: the second is given."""
    error = raised()
    given: list[str] = []

    def broken() -> None:
        raise OSError("the log's disk is full")

    def routing_cancelled() -> None:
        with FailureLog().telling(error):
            assert told(error, broken)
            assert told(error, lambda: given.append("second"))
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        routing_cancelled()
    assert given == ["second"]
