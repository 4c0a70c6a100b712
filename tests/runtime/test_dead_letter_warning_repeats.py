"""A storm of dead letters is a few warnings: alike ones (lane, reason, type) held back, counted.

A member on Redis Streams reports through :class:`~pipeline.runtime.progress.DeadLetterWarnings`,
as ``pipeline consume`` does, and its records go through a
:class:`~pipeline.log_repeats.RepeatFilter`, as every handler of ``configure_logging`` has one.
Before, the line's text held the error's, so 300 dead letters whose errors named their keys were
300 lines: the filter never found two alike. The storm here is of ``DeadLetter`` raised by the
handler on purpose: the dead letters of failures are told by the failure log's line instead
(``test_failure_line_tells_dead_letter.py``).
"""

from __future__ import annotations

import logging

import pytest
from redis.asyncio import Redis
from runtime.failure_helpers import storm_with_one_other, warning_member
from runtime.helpers import declare, eventually, lane_spec, produce, running

from pipeline.errors import DeadLetter
from pipeline.log_repeats import RepeatFilter
from pipeline.observability.metrics import Metrics
from pipeline.runtime import App, Context
from pipeline.runtime.progress import DeadLetterWarnings
from pipeline.transport.protocol import Transport

LOGGER = "pipeline.runtime.progress"


class NoCustomer(DeadLetter):
    """Another kind of dead letter the handler chooses."""


async def test_a_dead_letter_storm_over_varied_errors_is_a_few_counted_lines(
    streams: Transport,
    redis: Redis,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: RepeatFilter,
) -> None:
    """300 DeadLetters naming their keys are a few lines; another kind among them is shown."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    spec = lane_spec(f"dlw_{unique}", 1, ordered=False)  # no tiers: each failure dead-letters
    await declare(streams, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"other":
            raise NoCustomer("customer")
        raise DeadLetter(f"no order for {ctx.message.key!r}")

    await produce(streams, spec.name, storm_with_one_other(300))
    member = warning_member(app, streams, redis, unique, spec)
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 301)
    said = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    hint = f"(inspect: pipeline redrive {spec.dead_letter} --dry-run)"
    storm_lines = [line for line in said if ": DeadLetter: no order for" in line]
    assert 1 <= len(storm_lines) <= 12, len(storm_lines)  # the first, then after 1 s, 2 s, ...
    assert storm_lines[0].startswith(
        f"dead letter on lane {spec.lane}: fatal: DeadLetter: no order for b'key-"
    )
    assert storm_lines[0].endswith(f"' {hint}")
    assert all(f"{hint} [" in line and "more like this" in line for line in storm_lines[1:])
    (other,) = [line for line in said if "NoCustomer" in line]
    assert other == f"dead letter on lane {spec.lane}: fatal: NoCustomer: customer {hint}"
    assert len(said) == len(storm_lines) + 1


async def test_a_varied_storm_of_one_unit_shows_the_first_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Alike dead letters held back within a second are counted on the next line shown."""
    now = [0.0]
    repeats = RepeatFilter(lambda: now[0])
    warnings = DeadLetterWarnings(Metrics(), {"messages": "messages.dlq"}, repeats)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for n in range(100):
            now[0] = n / 100
            warnings.dead_lettered("messages", "fatal", ValueError(f"bad key-{n:x}"))
        warnings.dead_lettered("messages", "exhausted", ValueError("bad key-x"))  # another reason
        warnings.dead_lettered("other", "fatal", ValueError("bad key-y"))  # another lane
        now[0] = 1.0
        warnings.dead_lettered("messages", "fatal", ValueError("bad key-z"))
    said = [r.getMessage() for r in caplog.records]
    hint = "(inspect: pipeline redrive messages.dlq --dry-run)"
    held = "[99 more like this in the last 1s]"
    assert said == [
        f"dead letter on lane messages: fatal: ValueError: bad key-0 {hint}",
        f"dead letter on lane messages: exhausted: ValueError: bad key-x {hint}",
        (
            "dead letter on lane other: fatal: ValueError: bad key-y"
            " (inspect: pipeline redrive other.dlq --dry-run)"
        ),
        f"dead letter on lane messages: fatal: ValueError: bad key-z {hint} {held}",
    ]
