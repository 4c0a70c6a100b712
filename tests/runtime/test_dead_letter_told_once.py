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
from collections.abc import AsyncIterator, Mapping
from typing import cast

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline.envelope import Delivered, Message, Record
from pipeline.errors import PoisonMessage
from pipeline.log_repeats import RepeatFilter
from pipeline.observability.metrics import Metrics
from pipeline.retry.policy import default_retryable
from pipeline.retry.router import RetryRouter
from pipeline.runtime import App, Context
from pipeline.runtime.handling import HandlerStage
from pipeline.runtime.member import Member
from pipeline.runtime.progress import DeadLetterWarnings
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.stats import Stats
from pipeline.runtime.turns import TurnOutcome
from pipeline.transport.protocol import Producer, Transport

FAILURES = "pipeline.runtime.failure_log"
DEAD_LETTERS = "pipeline.runtime.progress"


def _warnings(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    """The first lines of ``logger``'s WARNINGs."""
    return [
        r.getMessage().splitlines()[0]
        for r in caplog.records
        if r.name == logger and r.levelno == logging.WARNING
    ]


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

    warnings = DeadLetterWarnings(Metrics(), {spec.lane: spec.dead_letter})
    member = Member(
        app, streams, f"g-{unique}", FAST, redis=redis, redis_prefix=unique, metrics=warnings
    )
    async with running(member):
        await produce(streams, spec.name, [Record(b"transient", b"k-1")])
        await eventually(lambda: member.stats.retried == 1)
        await produce(streams, spec.name, [Record(b"fatal", b"k-2")])
        await eventually(lambda: member.stats.dead_lettered == 1)

    assert _warnings(caplog, FAILURES) == [
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
    assert _warnings(caplog, DEAD_LETTERS) == []  # told by its failure's line


class _Stalling:
    """The transport's producer, but its second send waits until it is cancelled."""

    def __init__(self, inner: Producer) -> None:
        self._inner = inner
        self._sends = 0
        self.stalled = asyncio.Event()

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivered:
        """Send, unless this is the second send: then stall (a broker gone quiet)."""
        self._sends += 1
        if self._sends == 2:
            self.stalled.set()
            await asyncio.Event().wait()  # until cancelled
        return await self._inner.send(topic, value, key=key, headers=headers, partition=partition)


def _timed_out() -> None:
    """A turn handler's call that fails."""
    raise RuntimeError("the model timed out")


def _raised() -> Exception:
    """The failure of :func:`_timed_out`, caught: with a traceback, as a handler's has one."""
    try:
        _timed_out()
    except RuntimeError as exc:
        return exc
    raise AssertionError("it did not fail")


def _turn(topic: str, count: int, error: Exception) -> TurnOutcome:
    """A turn of ``count`` messages of ``topic`` that ended for good with ``error``."""
    messages = [Message(topic, 0, n, b"conversation-1", b"said %d" % n, {}) for n in range(count)]
    return TurnOutcome(messages, "exhausted", error, attempts=3)


@pytest.fixture
async def stalling(streams: Transport) -> AsyncIterator[_Stalling]:
    """A producer of the transport's whose second send stalls; closed after the test."""
    producer = streams.producer()
    yield _Stalling(producer)
    await producer.close()


def _stage(app: App, lane: str, producer: _Stalling, warnings: DeadLetterWarnings) -> HandlerStage:
    """A handler stage of ``app``'s ``lane`` routing through ``producer``, as a member's does."""
    lanes = [app.lanes[lane]]
    stats = Stats()
    router = RetryRouter(cast("Producer", producer))
    routing = Redirector(router, stats, default_retryable, lanes, metrics=warnings)
    return HandlerStage(app, routing, stats, lanes, cpu_workers=1)


async def test_a_turn_cancelled_while_routing_warns_of_the_dead_letters_it_produced(
    streams: Transport, stalling: _Stalling, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelled at its second dead letter, a turn's first is told by its own WARNING."""
    caplog.set_level(logging.WARNING)
    spec = lane_spec(f"dc_{unique}", 1, ordered=False, retry={"tiers": ["1s"], "max_attempts": 3})
    await declare(streams, spec)
    app = App([spec])
    app.handler(spec.lane)(_never_called)
    warnings = DeadLetterWarnings(Metrics(), {spec.lane: spec.dead_letter})
    stage = _stage(app, spec.lane, stalling, warnings)
    turn = _turn(spec.name, 3, _raised())

    settling = asyncio.create_task(stage.settle_turn(app.lanes[spec.lane], turn))
    await stalling.stalled.wait()  # the first dead letter is produced
    settling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await settling

    assert _warnings(caplog, DEAD_LETTERS) == [
        (
            f"dead letter on lane {spec.lane}: exhausted: RuntimeError: the model timed out"
            f" (inspect: pipeline redrive {spec.dead_letter} --dry-run)"
        )
    ]
    assert _warnings(caplog, FAILURES) == []  # the turn's line never came


async def test_a_poison_turn_keeps_its_dead_letter_line_and_has_no_failure_line(
    streams: Transport,
    stalling: _Stalling,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: RepeatFilter,
) -> None:
    """A turn dead-lettered as poison (the runtime's verdict, never raised) is one line."""
    caplog.set_level(logging.WARNING)
    spec = lane_spec(f"dp_{unique}", 1, ordered=False, retry={"tiers": ["1s"], "max_attempts": 3})
    await declare(streams, spec)
    app = App([spec])
    app.handler(spec.lane)(_never_called)
    warnings = DeadLetterWarnings(Metrics(), {spec.lane: spec.dead_letter})
    stage = _stage(app, spec.lane, stalling, warnings)
    poison = PoisonMessage("the turn of 'conversation-1' started 3 times and never finished")

    assert await stage.settle_turn(app.lanes[spec.lane], _turn(spec.name, 1, poison))

    assert _warnings(caplog, FAILURES) == []
    assert _warnings(caplog, DEAD_LETTERS) == [
        (
            f"dead letter on lane {spec.lane}: poison: PoisonMessage: the turn of 'conversation-1'"
            f" started 3 times and never finished"
            f" (inspect: pipeline redrive {spec.dead_letter} --dry-run)"
        )
    ]


async def _never_called(event: bytes, ctx: Context) -> None:
    """The lane's handler: the turns settled here ended before (their outcome is given)."""
    raise AssertionError("not called")
