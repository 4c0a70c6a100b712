"""A failure that ends in a dead letter is one WARNING: the failure log's, with the redrive hint.

A member on Redis Streams reports through :class:`~pipeline.runtime.progress.DeadLetterWarnings`,
as ``pipeline consume`` does, and every record goes through a
:class:`~pipeline.log_repeats.RepeatFilter` on the handler, as ``configure_logging`` puts one on
the root's. Before:

* each final failure was two WARNINGs, the effect before the cause: ``dead letter on lane ...:
  exhausted: ... (inspect: pipeline redrive ... --dry-run)``, then the failure log's ``handler
  failed ... next: dead letter (exhausted)`` and its traceback;
* the root filter kept each failure line's whole text, traceback included, as a key, and held
  back a line the failure log had chosen to show when its text was alike but for numbers;
* lanes whose names differ by a digit (``fl1_...``, ``fl2_...``) were alike: the failure log's
  filter blanked the digits of its key too, so the second lane's failure was held back.

A dead letter with no failure line (the handler's own ``DeadLetter``) keeps its warning.
"""

from __future__ import annotations

import logging

import pytest
from redis.asyncio import Redis
from runtime.failure_helpers import DEAD_LETTERS, FAILURES, logged, warning_member
from runtime.helpers import declare, eventually, lane_spec, produce, running

from pipeline.envelope import Record
from pipeline.errors import DeadLetter
from pipeline.log_repeats import RepeatFilter
from pipeline.observability.metrics import Metrics
from pipeline.runtime import App, Context
from pipeline.runtime.progress import DeadLetterWarnings
from pipeline.transport.protocol import Transport


async def test_a_failed_message_is_one_warning_with_its_redrive_hint_on_each_lane(
    streams: Transport,
    redis: Redis,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: RepeatFilter,
) -> None:
    """Each lane's failure is its own line, ending with the hint; no dead-letter line repeats it."""
    caplog.set_level(logging.WARNING)
    root = caplog_repeats  # as configure_logging puts on every handler of the root
    first = lane_spec(f"fl1_{unique}", 1, ordered=False)  # no tiers: each failure dead-letters
    second = lane_spec(f"fl2_{unique}", 1, ordered=False)
    await declare(streams, first, second)
    app = App([first, second])

    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"chosen":
            raise DeadLetter(f"order {ctx.message.offset} has no customer")
        raise ValueError(f"no order for {ctx.message.key!r}")

    app.handler(first.lane)(handle)
    app.handler(second.lane)(handle)
    await produce(streams, first.name, [Record(b"v", b"k-1"), Record(b"chosen", b"k-2")])
    await produce(streams, second.name, [Record(b"v", b"k-1")])
    member = warning_member(app, streams, redis, unique, first, second)
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 3)

    heads = sorted(r.getMessage().splitlines()[0] for r in logged(caplog, FAILURES))
    assert heads == [
        (
            f"lane {spec.lane}: handler failed on {spec.name}[0]@0 (key k-1, attempt 1 of 1):"
            f" ValueError: no order for b'k-1'; next: dead letter (exhausted)"
            f" (inspect: pipeline redrive {spec.dead_letter} --dry-run)"
        )
        for spec in (first, second)
    ]
    dead_letters = [r.getMessage() for r in caplog.records if r.name == DEAD_LETTERS]
    assert dead_letters == [  # only the one the handler chose: no failure line told it
        (
            f"dead letter on lane {first.lane}: fatal: DeadLetter: order 1 has no customer"
            f" (inspect: pipeline redrive {first.dead_letter} --dry-run)"
        )
    ]
    assert not [key for key in root._seen if key[0] in (FAILURES, DEAD_LETTERS)]


def test_a_line_the_failure_log_shows_is_not_held_back_by_the_roots_filter(
    caplog: pytest.LogCaptureFixture, caplog_repeats: RepeatFilter
) -> None:
    """Two alike dead-letter lines of lanes ``d1`` and ``d2`` both pass the root's filter."""
    caplog.set_level(logging.WARNING, logger=DEAD_LETTERS)
    root = caplog_repeats
    warnings = DeadLetterWarnings(Metrics(), {})
    warnings.dead_lettered("d1", "poison", ValueError("stuck 1"))
    warnings.dead_lettered("d2", "poison", ValueError("stuck 2"))
    warnings.dead_lettered("d1", "poison", ValueError("stuck 3"))  # alike the first: held back
    said = [r.getMessage() for r in caplog.records]
    hint = "(inspect: pipeline redrive {}.dlq --dry-run)"
    assert said == [
        f"dead letter on lane d1: poison: ValueError: stuck 1 {hint.format('d1')}",
        f"dead letter on lane d2: poison: ValueError: stuck 2 {hint.format('d2')}",
    ]
    assert not root._seen
