"""Every dead letter of a failure is told by a WARNING: the failure's line or its own.

A member (or its handler stage) on Redis Streams reports through
:class:`~pipeline.runtime.progress.DeadLetterWarnings`, as ``pipeline consume`` does, and every
record goes through a :class:`~pipeline.log_repeats.RepeatFilter`, as ``configure_logging`` puts
one on the root's handlers. Before:

* a dead letter whose failure was alike (lane, type, place) to a retried one a moment before
  was told by no WARNING: its failure line was held back as a repeat of the retried one's, and
  its dead-letter warning left out because the failure log would tell it;
* a turn's routing cancelled halfway (a shutdown, a revocation) left the dead letters already
  produced untold: their warnings were left out for a failure line that never came;
* a poison turn was a failure line ``handler failed on a turn ... PoisonMessage`` with an empty
  traceback, in place of its ``dead letter on lane`` line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from runtime.failure_helpers import (
    DEAD_LETTERS,
    FAILURES,
    SecondSendAmiss,
    failed_turn,
    first_lines,
    hand_settled,
    raised,
    routing_stage,
    warning_member,
    warnings_of,
)
from runtime.helpers import declare, eventually, lane_spec, produce, running

from pipeline.envelope import Record
from pipeline.errors import PoisonMessage
from pipeline.log_repeats import RepeatFilter
from pipeline.runtime import App, Context
from pipeline.transport.protocol import Producer, Transport


async def test_a_dead_letter_alike_to_a_retried_failure_has_its_own_line(
    streams: Transport,
    redis: Redis,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: RepeatFilter,
) -> None:
    """One ValueError of one place retried, then dead-lettered as fatal: two failure lines."""
    caplog.set_level(logging.INFO)
    spec = lane_spec(f"dt_{unique}", 1, ordered=False, retry={"tiers": ["30s"], "max_attempts": 3})
    await declare(streams, spec)
    app = App([spec], retryable=lambda e: "fatal" not in str(e))

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        raise ValueError(event.decode())  # one type, one place

    member = warning_member(app, streams, redis, unique, spec)
    async with running(member):
        await produce(streams, spec.name, [Record(b"transient", b"k-1")])
        await eventually(lambda: member.stats.retried == 1)
        await produce(streams, spec.name, [Record(b"fatal", b"k-2")])
        await eventually(lambda: member.stats.dead_lettered == 1)

    assert first_lines(caplog, FAILURES) == [
        (
            f"lane {spec.lane}: handler failed on {spec.name}[0]@0 (key k-1, attempt 1 of 3):"
            f" ValueError: transient; next: retry tier {spec.name}.retry.30s"
        ),
        (
            f"lane {spec.lane}: handler failed on {spec.name}[0]@1 (key k-2, attempt 1 of 3):"
            f" ValueError: fatal; next: dead letter (fatal)"
            f" (inspect: pipeline redrive {spec.dead_letter} --dry-run)"
        ),
    ]
    assert first_lines(caplog, DEAD_LETTERS) == []  # told by its failure's line


class _Stalling(SecondSendAmiss):
    """The transport's producer, but its second send waits until it is cancelled."""

    def __init__(self, inner: Producer) -> None:
        """Wrap ``inner``; :attr:`stalled` is set when the second send stalls."""
        super().__init__(inner)
        self.stalled = asyncio.Event()

    async def second(self) -> None:
        """Stall (a broker gone quiet)."""
        self.stalled.set()
        await asyncio.Event().wait()  # until cancelled


@pytest.fixture
async def stalling(streams: Transport) -> AsyncIterator[_Stalling]:
    """A producer of the transport's whose second send stalls; closed after the test."""
    producer = streams.producer()
    yield _Stalling(producer)
    await producer.close()


async def test_a_turn_cancelled_while_routing_warns_of_the_dead_letters_it_produced(
    streams: Transport, stalling: _Stalling, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelled at its second dead letter, a turn's first is told by its own WARNING."""
    caplog.set_level(logging.WARNING)
    spec, app = await hand_settled(streams, f"dc_{unique}")
    stage = routing_stage(app, spec.lane, stalling.as_producer(), warnings_of(spec))
    turn = failed_turn(spec.name, 3, raised())

    settling = asyncio.create_task(stage.settle_turn(app.lanes[spec.lane], turn))
    await stalling.stalled.wait()  # the first dead letter is produced
    settling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await settling

    assert first_lines(caplog, DEAD_LETTERS) == [
        (
            f"dead letter on lane {spec.lane}: exhausted: RuntimeError: the model timed out"
            f" (inspect: pipeline redrive {spec.dead_letter} --dry-run)"
        )
    ]
    assert first_lines(caplog, FAILURES) == []  # the turn's line never came


async def test_a_poison_turn_keeps_its_dead_letter_line_and_has_no_failure_line(
    streams: Transport,
    stalling: _Stalling,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: RepeatFilter,
) -> None:
    """A turn dead-lettered as poison (the runtime's verdict, never raised) is one line."""
    caplog.set_level(logging.WARNING)
    spec, app = await hand_settled(streams, f"dp_{unique}")
    stage = routing_stage(app, spec.lane, stalling.as_producer(), warnings_of(spec))
    poison = PoisonMessage("the turn of 'conversation-1' started 3 times and never finished")

    assert await stage.settle_turn(app.lanes[spec.lane], failed_turn(spec.name, 1, poison))

    assert first_lines(caplog, FAILURES) == []
    assert first_lines(caplog, DEAD_LETTERS) == [
        (
            f"dead letter on lane {spec.lane}: poison: PoisonMessage: the turn of 'conversation-1'"
            f" started 3 times and never finished"
            f" (inspect: pipeline redrive {spec.dead_letter} --dry-run)"
        )
    ]
