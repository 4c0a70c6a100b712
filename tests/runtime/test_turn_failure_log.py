"""A debounced turn's failure is logged like a message's: named, with its traceback, backed off.

A member on Redis Streams runs a debounced lane whose turn handler raises. Each failed turn is a
WARNING naming the lane, how many messages the turn held and where its last one was read, the
attempt of how many, the exception and what happens next (run again after backoff, or dead
letter and why), then its traceback through the handler's frame; an outcome the handler chose
(``DeadLetter``) is one INFO line. Before, a turn's failure was logged nowhere.
"""

from __future__ import annotations

import logging

import pytest
from redis.asyncio import Redis
from runtime.failure_helpers import FAILURES, logged
from runtime.helpers import QUIET, Said, declare, lane_spec, produce, ran_until, said

from pipeline.errors import DeadLetter
from pipeline.runtime import App, Context
from pipeline.transport.protocol import Transport

LOGGER = FAILURES


async def test_a_failed_turn_warns_with_its_traceback_then_its_dead_letter_says_why(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Turn of 2 messages: attempt 1 runs again after backoff, attempt 2 is dead-lettered."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    spec = lane_spec(f"tf_{unique}", 1, debounce=QUIET, retry={"max_attempts": 2})
    await declare(streams, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def answer(events: list[Said], ctx: Context) -> None:
        if events[0].conversation_id == "chosen":
            raise DeadLetter("cannot answer")
        if ctx.attempt == 1:
            raise RuntimeError(f"model down for {len(events)}")
        raise LookupError("no such conversation")

    records = [said("c1", 0), said("c1", 1), said("chosen", 0)]
    await produce(streams, spec.name, records)
    await ran_until(app, streams, redis, unique, lambda m: m.stats.dead_lettered == 3)
    first, last = logged(caplog, LOGGER, logging.WARNING)
    head = first.getMessage().splitlines()[0]
    assert head == (
        f"lane {spec.lane}: handler failed on a turn of 2 messages up to {spec.name}[0]@1"
        " (attempt 1 of 2): RuntimeError: model down for 2; next: run again after backoff"
    )
    text = caplog.handler.format(first)
    assert "Traceback (most recent call last):" in text
    assert f'"{__file__}"' in text
    assert "in answer" in text
    assert text.rstrip().endswith("RuntimeError: model down for 2")
    assert last.getMessage().splitlines()[0] == (
        f"lane {spec.lane}: handler failed on a turn of 2 messages up to {spec.name}[0]@1"
        " (attempt 2 of 2): LookupError: no such conversation; next: dead letter (exhausted)"
        f" (inspect: pipeline redrive {spec.dead_letter} --dry-run)"
    )
    assert caplog.handler.format(last).rstrip().endswith("LookupError: no such conversation")
    (chosen,) = logged(caplog, LOGGER, logging.INFO)
    assert "Traceback" not in caplog.handler.format(chosen)
    assert chosen.getMessage() == (
        f"lane {spec.lane}: handler chose DeadLetter for a turn of 1 message up to"
        f" {spec.name}[0]@2 (attempt 1 of 2): cannot answer; next: dead letter (fatal)"
    )


async def test_alike_failed_turns_are_held_back_and_counted(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """40 conversations' turns failing alike at once are a few lines, not 40."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    spec = lane_spec(f"tf_{unique}", 1, debounce=QUIET, retry={"max_attempts": 1})
    await declare(streams, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def answer(events: list[Said], ctx: Context) -> None:
        raise RuntimeError(f"model down for {events[0].conversation_id}")

    await produce(streams, spec.name, [said(f"conv-{n:x}", 0) for n in range(40)])
    await ran_until(app, streams, redis, unique, lambda m: m.stats.dead_lettered == 40)
    lines = [r.getMessage().splitlines()[0] for r in logged(caplog, LOGGER, logging.WARNING)]
    assert 1 <= len(lines) < 10, lines
    assert all("next: dead letter (exhausted)" in line for line in lines)
    assert all("more like this" in line for line in lines[1:])
