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
from collections.abc import Mapping
from typing import cast

import pytest
from runtime.helpers import declare, lane_spec, the_dead_letter

from pipeline.envelope import Delivered, Message
from pipeline.errors import TransportError
from pipeline.observability.metrics import Metrics
from pipeline.retry.policy import default_retryable
from pipeline.retry.router import RetryRouter
from pipeline.runtime import App, Context
from pipeline.runtime.failure_log import FailureLog, told
from pipeline.runtime.handling import HandlerStage
from pipeline.runtime.progress import DeadLetterWarnings
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.stats import Stats
from pipeline.runtime.turns import TurnOutcome
from pipeline.transport.protocol import Producer, Transport

FAILURES = "pipeline.runtime.failure_log"
DEAD_LETTERS = "pipeline.runtime.progress"


class _RefusingSecond:
    """The transport's producer, but the broker refuses its second send."""

    def __init__(self, inner: Producer) -> None:
        self._inner = inner
        self._sends = 0

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivered:
        """Send, unless this is the second send: then the broker refuses it."""
        self._sends += 1
        if self._sends == 2:
            raise TransportError("the broker refused the send")
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


async def _never_called(event: bytes, ctx: Context) -> None:
    """The lane's handler: the turn settled here ended before (its outcome is given)."""
    raise AssertionError("not called")


def _first_lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    """The first lines of ``logger``'s WARNINGs."""
    return [
        r.getMessage().splitlines()[0]
        for r in caplog.records
        if r.name == logger and r.levelno == logging.WARNING
    ]


async def test_a_turn_whose_later_dead_letter_is_refused_warns_of_the_one_produced(
    streams: Transport, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """3 messages, the 2nd refused: the turn's line says not routed, @0 has its own WARNING."""
    caplog.set_level(logging.WARNING)
    spec = lane_spec(f"pd_{unique}", 1, ordered=False, retry={"tiers": ["1s"], "max_attempts": 3})
    await declare(streams, spec)
    app = App([spec])
    app.handler(spec.lane)(_never_called)
    lane = app.lanes[spec.lane]
    warnings = DeadLetterWarnings(Metrics(), {spec.lane: spec.dead_letter})
    producer = streams.producer()
    try:
        router = RetryRouter(cast("Producer", _RefusingSecond(producer)))
        routing = Redirector(router, Stats(), default_retryable, [lane], metrics=warnings)
        routing.stopping = True  # a member stopping: the refused send is not tried again
        stage = HandlerStage(app, routing, Stats(), [lane], cpu_workers=1)
        said = [Message(spec.name, 0, n, b"conversation-1", b"said %d" % n, {}) for n in range(3)]
        turn = TurnOutcome(said, "exhausted", _raised(), attempts=3)
        settled = await stage.settle_turn(lane, turn)
    finally:
        await producer.close()

    assert not settled  # it runs again
    (dead,) = [await the_dead_letter(streams, spec, unique)]
    assert dead.value == b"said 0"
    (failure,) = _first_lines(caplog, FAILURES)
    assert failure.endswith("next: not routed, run again after backoff"), failure
    assert _first_lines(caplog, DEAD_LETTERS) == [
        (
            f"dead letter on lane {spec.lane}: exhausted: RuntimeError: the model timed out"
            f" (inspect: pipeline redrive {spec.dead_letter} --dry-run)"
        )
    ]


async def test_a_failing_warning_skips_no_other_and_the_cancel_goes_on() -> None:
    """Two warnings left out, the first raising, the routing cancelled: the second is given."""
    error = _raised()
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
