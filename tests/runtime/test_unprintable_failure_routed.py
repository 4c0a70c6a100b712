"""A handler's exception whose ``__str__`` raises is still routed, and named by a placeholder.

Before, the router wrote the error's text into the copy's headers with a bare ``str(error)``: the
routing failed ("failed before it was routed; it is left for redelivery") and the message was
redelivered for ever, a poison pill; the dead-letter warning's line raised the same way.
"""

from __future__ import annotations

import logging

import pytest
from redis.asyncio import Redis
from runtime.failure_helpers import FAILURES, warning_member
from runtime.helpers import declare, eventually, lane_spec, produce, running, the_dead_letter

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.observability.metrics import Metrics
from pipeline.runtime import App, Context
from pipeline.runtime.progress import DeadLetterWarnings
from pipeline.transport.protocol import Transport

PLACEHOLDER = "<Unprintable.__str__ raised>"


class Unprintable(Exception):
    """An app's exception that cannot be turned into text."""

    def __str__(self) -> str:
        """Fail, as a buggy ``__str__`` of an app's does."""
        raise RuntimeError("no text")

    def __repr__(self) -> str:
        """Fail too."""
        raise RuntimeError("no repr")


async def test_an_unprintable_failure_goes_to_its_retry_tier_then_the_dead_letter_topic(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Attempt 1 goes to the 100 ms tier, attempt 2 to the DLQ, its error text a placeholder."""
    caplog.set_level(logging.WARNING)
    spec = lane_spec(f"flstr_{unique}", 1, retry={"tiers": ["100ms"], "max_attempts": 2})
    await declare(streams, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        raise Unprintable

    await produce(streams, spec.name, [Record(b"v", b"k")])
    member = warning_member(app, streams, redis, unique, spec)
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 1)
    assert member.stats.retried == 1
    dead = await the_dead_letter(streams, spec, unique)
    assert dead.headers[h.ERROR_MESSAGE] == PLACEHOLDER.encode()
    assert dead.headers[h.ERROR_CLASS].endswith(b".Unprintable")
    assert dead.headers[h.ATTEMPT] == b"2"
    said = [r.getMessage() for r in caplog.records]
    assert not [line for line in said if "before it was routed" in line]
    failures = [r.getMessage() for r in caplog.records if r.name == FAILURES]
    assert failures, said
    assert f"Unprintable: {PLACEHOLDER}; next: retry tier {spec.name}.retry.100ms" in failures[0]


def test_the_dead_letter_warning_names_an_unprintable_error_by_a_placeholder(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A dead letter of no failure line (poison here) with such an error is still one line."""
    warnings = DeadLetterWarnings(Metrics(), {"messages": "messages.dlq"})
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.progress"):
        warnings.dead_lettered("messages", "poison", Unprintable())
    assert [r.getMessage() for r in caplog.records] == [
        (
            f"dead letter on lane messages: poison: Unprintable: {PLACEHOLDER}"
            " (inspect: pipeline redrive messages.dlq --dry-run)"
        )
    ]
