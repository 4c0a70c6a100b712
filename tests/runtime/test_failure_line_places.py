"""A failure's line shows the code that failed, and places it there, on CPU lanes and groups.

A member on Redis Streams runs handlers that fail in two functions with one exception type:

* on a CPU lane the exception comes back from its worker pickled, without its traceback: the
  worker adds its traceback as a note, the line prints it, and the failure is placed where it
  was raised. Before, the line showed only ``handling.py -> cpu.py`` and every failure's place
  was ``run (cpu.py)``, so a ValueError of ``inner_a`` held back one of ``inner_b``;
* a handler whose ``asyncio.TaskGroup`` fails raises an ExceptionGroup: its sub-exceptions are
  printed with their frames, and the failure is placed by its first one. Before, the line showed
  no frame of the failing code and every group's place was ``__aexit__ (taskgroups.py)``.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.asyncio import Redis
from runtime import cpu_failing_app
from runtime.failure_helpers import FAILURES, cpu_lane_dead_lettered, logged, past_position
from runtime.helpers import declare, lane_spec, produce, ran_until

from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.failure_log import GROUP_SHOWN, MAX_TRACEBACK_CHARS, traceback_text
from pipeline.transport.protocol import Transport

LOGGER = FAILURES


def _shown(caplog: pytest.LogCaptureFixture) -> dict[str, str]:
    """The failure log's WARNINGs, formatted, by the text of their first line's exception."""
    return {past_position(r): caplog.handler.format(r) for r in logged(caplog, LOGGER)}


async def test_a_cpu_lanes_failures_show_the_workers_frames_and_are_placed_there(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two ValueErrors raised in two functions of a CPU handler are two lines, each its frames."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    records = [Record(b"a1", b"k1"), Record(b"b1", b"k2")]  # each failure dead-letters
    await cpu_lane_dead_lettered(
        streams, redis, unique, f"flcpu_{unique}", cpu_failing_app.crunch, records, 90
    )
    shown = _shown(caplog)
    assert len(shown) == 2, list(shown)  # not alike: raised in two places
    a_text = next(text for head, text in shown.items() if head.startswith("ValueError: bad a"))
    b_text = next(text for head, text in shown.items() if head.startswith("ValueError: bad b"))
    app_file = cpu_failing_app.__file__
    assert f"raised in inner_a ({app_file})" in a_text
    assert f'File "{app_file}"' in a_text
    assert "in crunch" in a_text
    assert 'raise ValueError(f"bad a {event!r}")' in a_text
    assert "in inner_b" not in a_text
    assert 'raise ValueError(f"bad b {event!r}")' in b_text
    assert a_text.rstrip().endswith("ValueError: bad a b'a1'")


async def inner_a() -> None:
    """Where a task of the group handler fails for an event ``a``."""
    raise ValueError("no stock for a")


async def inner_b() -> None:
    """Where a task of the group handler fails for any other event."""
    raise ValueError("no stock for b")


async def test_a_task_groups_failure_shows_its_sub_exceptions_and_is_placed_by_the_first(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """ExceptionGroups of one TaskGroup failing in two functions are two lines, each its frames."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    spec = lane_spec(f"flgroup_{unique}", 1, ordered=False)
    await declare(streams, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(inner_a() if event == b"a" else inner_b())

    await produce(streams, spec.name, [Record(b"a", b"k1"), Record(b"b", b"k2")])
    await ran_until(app, streams, redis, unique, lambda m: m.stats.dead_lettered == 2)
    shown = _shown(caplog)
    assert len(shown) == 2, list(shown)  # not alike: their first failures are in two places
    group_head = "ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)"
    a_head = f"{group_head} (first: ValueError: no stock for a); next: dead letter (exhausted)"
    assert any(head.startswith(a_head) for head in shown), list(shown)
    a_text = next(text for head, text in shown.items() if head.startswith(a_head))
    assert "in handle" in a_text
    assert "  |   File" in a_text
    assert "in inner_a" in a_text
    assert '  |     raise ValueError("no stock for a")' in a_text
    assert "  | ValueError: no stock for a" in a_text


def test_notes_and_many_sub_exceptions_are_printed_bounded() -> None:
    """Notes are printed; a group of 50 shows its first few; the whole stays bounded."""

    def fail(n: int) -> None:
        raise ValueError(f"item {n} " + "x" * 5000)

    def caught(n: int) -> ValueError:
        try:
            fail(n)
        except ValueError as exc:
            return exc
        raise AssertionError

    def fail_all() -> None:
        raise ExceptionGroup("batch failed", [caught(n) for n in range(50)])

    try:
        fail_all()
    except ExceptionGroup as exc:
        exc.add_note("order 42 of tenant acme")
        exc.add_note("y" * 10_000)
        text = traceback_text(exc)
    assert "order 42 of tenant acme" in text
    assert "y" * 10_000 not in text
    assert "ValueError: item 0 " in text
    assert f"ValueError: item {GROUP_SHOWN} " not in text
    assert f"{50 - GROUP_SHOWN} more left out" in text
    assert len(text) <= MAX_TRACEBACK_CHARS + 100
