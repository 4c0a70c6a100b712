"""A handler's failure is logged with its traceback: named, backed off, bounded in size.

A member on Redis Streams runs handlers that raise. The first failure of a kind (lane, exception
type, where it was raised) is a WARNING with the message's position, key and attempt, what
happens to it next, and its traceback down to the handler's own frame; its repeats are held
back (:class:`~pipeline.log_repeats.RepeatFilter`), a different exception is shown. A traceback
is cut to a bounded size (a 1 MiB message, a RecursionError's thousand frames). An outcome the
handler chose (``DeadLetter``) is one INFO line, without a traceback.
"""

from __future__ import annotations

import logging

import pytest
from pydantic import BaseModel
from redis.asyncio import Redis
from runtime.failure_helpers import FAILURES, logged, storm_with_one_other
from runtime.helpers import declare, idle_lane, lane_spec, produce, ran_until, the_dead_letter

from pipeline import headers as h
from pipeline.envelope import Message, Record
from pipeline.errors import DeadLetter
from pipeline.log_repeats import RepeatFilter
from pipeline.runtime import App, Context
from pipeline.runtime.failure_log import MAX_TRACEBACK_CHARS, FailureLog
from pipeline.runtime.redirect import Routed
from pipeline.transport.protocol import Transport

LOGGER = FAILURES


async def test_a_failure_warns_with_the_handlers_frame_then_its_repeats_are_held_back(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The first attempt's WARNING names the message and its retry, with the handler's frame.

    The second attempt's failure is alike but ends in a dead letter: its own line (before, it
    was held back as a repeat of the retried one, and its dead letter told by no WARNING).
    """
    caplog.set_level(logging.DEBUG)
    spec = lane_spec(f"fh_{unique}", 1, retry={"tiers": ["100ms"], "max_attempts": 2})
    await declare(streams, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def charge_card(event: bytes, ctx: Context) -> None:
        raise RuntimeError(f"boom {ctx.attempt}")

    await produce(streams, spec.name, [Record(b"v", b"k-17")])
    member = await ran_until(app, streams, redis, unique, lambda m: m.stats.dead_lettered == 1)
    assert member.stats.retried == 1
    first, final = logged(caplog, LOGGER, logging.WARNING)  # what happens next makes them not alike
    assert "(key k-17, attempt 2 of 2): RuntimeError: boom 2; next: dead letter (exhausted)" in (
        final.getMessage()
    )
    head, *_ = first.getMessage().splitlines()
    text = caplog.handler.format(first)
    assert head.startswith(f"lane {spec.lane}: handler failed on {spec.name}[0]@0")
    assert "(key k-17, attempt 1 of 2): RuntimeError: boom 1;" in head
    assert f"next: retry tier {spec.name}.retry.100ms" in head
    assert "Traceback (most recent call last):" in text
    assert f'"{__file__}"' in text
    assert "in charge_card" in text
    assert 'raise RuntimeError(f"boom {ctx.attempt}")' in text
    assert text.rstrip().endswith("RuntimeError: boom 1")


async def test_a_thousand_alike_failures_give_a_few_lines_and_a_new_one_is_shown(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """1,000 failures alike (keys and numbers differ) are a few lines; another kind is shown."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    spec = lane_spec(f"fh_{unique}", 1, ordered=False)  # no tiers: each failure dead-letters
    await declare(streams, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"other":
            raise KeyError("customer")
        raise RuntimeError(f"boom {ctx.message.offset} for {ctx.message.key!r}")

    await produce(streams, spec.name, storm_with_one_other(1000))
    await ran_until(app, streams, redis, unique, lambda m: m.stats.dead_lettered == 1001)
    lines = logged(caplog, LOGGER, logging.WARNING)
    storm_lines = [r for r in lines if "RuntimeError: boom" in r.getMessage()]
    assert 1 <= len(storm_lines) <= 12  # the first, then one after 1 s, 2 s, 4 s ...
    assert all("more like this" in r.getMessage() for r in storm_lines[1:])
    (other,) = [r for r in lines if "KeyError: 'customer'" in r.getMessage()]
    assert "key odd" in other.getMessage()
    assert "next: dead letter (exhausted)" in other.getMessage()
    assert "in handle" in caplog.handler.format(other)
    assert len(lines) == len(storm_lines) + 1


async def test_a_huge_message_and_a_deep_recursion_are_cut(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 1 MiB exception message and a RecursionError's frames fit in a bounded traceback."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    spec = lane_spec(f"fh_{unique}", 1, ordered=False)
    await declare(streams, spec)
    app = App([spec])

    def down(depth: int) -> int:
        return down(depth + 1) + 1

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"huge":
            raise ValueError("x" * (1 << 20))
        down(0)

    await produce(streams, spec.name, [Record(b"huge", b"h"), Record(b"deep", b"d")])
    await ran_until(app, streams, redis, unique, lambda m: m.stats.dead_lettered == 2)
    lines = logged(caplog, LOGGER, logging.WARNING)
    assert len(lines) == 2
    for record in lines:
        text = caplog.handler.format(record)
        assert len(text) < MAX_TRACEBACK_CHARS + 2000, len(text)
        assert "in handle" in text
    huge, deep = sorted(lines, key=lambda r: "RecursionError" in r.getMessage())
    huge_text = caplog.handler.format(huge)
    assert "characters left out" in huge_text
    assert len(huge.getMessage().splitlines()[0]) < 1000
    deep_text = caplog.handler.format(deep)
    assert "frames left out" in deep_text
    assert "in down" in deep_text
    assert deep_text.splitlines()[-1].startswith("RecursionError: maximum recursion depth")


async def test_a_dead_letter_the_handler_chose_is_one_info_line(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``raise DeadLetter(...)`` is the handler's decision: INFO, no traceback, no WARNING."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    spec = lane_spec(f"fh_{unique}", 1, retry={"tiers": ["100ms"]})
    await declare(streams, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        raise DeadLetter("order 7 has no customer")

    await produce(streams, spec.name, [Record(b"v", b"k")])
    await ran_until(app, streams, redis, unique, lambda m: m.stats.dead_lettered == 1)
    assert not logged(caplog, LOGGER, logging.WARNING)
    (line,) = logged(caplog, LOGGER, logging.INFO)
    text = caplog.handler.format(line)
    assert "\n" not in text
    assert (
        f"lane {spec.lane}: handler chose DeadLetter for {spec.name}[0]@0 (key k, attempt 1 of 2):"
        " order 7 has no customer; next: dead letter (fatal)"
    ) in text


class Order(BaseModel):
    """What the handler of the validation test expects."""

    order_id: int


async def test_a_fatal_error_on_the_last_attempt_says_the_dead_letters_own_reason(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A ValidationError on the last attempt is dead-lettered as fatal, and the line says so.

    Before, the line guessed the reason from the attempt: ``dead letter (exhausted)``, while
    the dead letter said ``fatal``.
    """
    caplog.set_level(logging.WARNING, logger=LOGGER)
    spec = lane_spec(f"fh_{unique}", 1, retry={"tiers": ["100ms"], "max_attempts": 2})
    await declare(streams, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if ctx.attempt == 1:
            raise ConnectionError("the bank is down")
        Order.model_validate_json(event)

    await produce(streams, spec.name, [Record(b"{}", b"k")])
    await ran_until(app, streams, redis, unique, lambda m: m.stats.dead_lettered == 1)
    dead = await the_dead_letter(streams, spec, unique)
    assert dead.headers[h.DEAD_REASON] == b"fatal"
    first, last = (r.getMessage().splitlines()[0] for r in logged(caplog, LOGGER, logging.WARNING))
    assert "(key k, attempt 1 of 2): ConnectionError: the bank is down;" in first
    assert first.endswith(f"next: retry tier {spec.name}.retry.100ms")
    assert "(key k, attempt 2 of 2): pydantic_core._pydantic_core.ValidationError:" in last
    hint = f"(inspect: pipeline redrive {spec.dead_letter} --dry-run)"
    assert last.endswith(f"; next: dead letter (fatal) {hint}"), last


def test_the_next_line_of_a_kind_counts_those_held_back(caplog: pytest.LogCaptureFixture) -> None:
    """Failures alike held back for a second are counted on the line shown after it."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    now = [0.0]
    failures = FailureLog(RepeatFilter(lambda: now[0]))
    lane = idle_lane("fhcount")

    def boom(offset: int) -> None:
        raise RuntimeError(f"boom {offset}")

    def fail(offset: int) -> None:
        try:
            boom(offset)
        except RuntimeError as exc:
            message = Message("fhcount", 0, offset, f"key-{offset}".encode(), b"v", {}, 0)
            failures.failed(lane, message, 1, exc, Routed("dead_lettered", "exhausted"))

    for offset in range(100):  # all within the first second
        now[0] = offset / 100
        fail(offset)
    now[0] = 1.0
    fail(100)
    first, second = (r.getMessage() for r in logged(caplog, LOGGER, logging.WARNING))
    assert "@0 (key key-0," in first
    assert "more like this" not in first
    head = second.splitlines()[0]
    assert "@100 (key key-100," in head
    assert head.endswith("[99 more like this in the last 1s]")
