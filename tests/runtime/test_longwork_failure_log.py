"""Long work's failures go through the failure log; its stops stay the stop's own line.

A lane with ``heartbeat_timeout`` runs its handlers through the cancel gate
(:class:`~pipeline.runtime.longwork.LongWork`). A handler of such a lane that raises, ``async``
or ``cpu=True``, is one failure-log WARNING per attempt (the next step, the traceback), its
final failure one line (no dead-letter warning besides). A run that is stopped is not a
handler failure: cancelled, it is one INFO line of the gate; hung, one WARNING of the gate,
then routed as ``HandlerHung``. That holds when the handler raises on its way out of the stop
(a ``finally`` that fails): before, that exception was routed and logged as the handler's
failure (a retry-tier copy of cancelled work, a hung run neither counted nor told).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.asyncio import Redis
from runtime import cpu_failing_app
from runtime.helpers import eventually, lane_spec, running
from runtime.owned import Declare

from pipeline.config import RuntimeSettings
from pipeline.log_repeats import RepeatFilter
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

QUICK = RuntimeSettings(
    commit_interval_ms=100, shutdown_grace_s=5.0, cancel_poll_ms=50, cancel_grace_s=0.5
)
FAILURES = "pipeline.runtime.failure_log"
GATE = "pipeline.runtime.longwork"


def _records(caplog: pytest.LogCaptureFixture, lane: str) -> list[logging.LogRecord]:
    """The runtime's records at INFO or above that name ``lane`` (admin and member lines not)."""
    return [
        r
        for r in caplog.records
        if r.levelno >= logging.INFO
        and r.name.startswith("pipeline.runtime.")
        and r.name != "pipeline.runtime.member"
        and lane in r.getMessage()
    ]


def _long_lane(unique: str) -> TopicSpec:
    """A lane of long work: two attempts, a retry tier of 100 ms, a heartbeat timeout of 1 s."""
    return lane_spec(
        f"lw_{unique}", 1, retry={"tiers": ["100ms"], "max_attempts": 2}, heartbeat_timeout="1s"
    )


async def _send(transport: Transport, spec: TopicSpec) -> None:
    producer = transport.producer()
    try:
        await producer.send(spec.name, b"x", key=b"k-1")
    finally:
        await producer.close()


def _assert_failure_lines(
    caplog: pytest.LogCaptureFixture, spec: TopicSpec, raised: str, frame: str
) -> None:
    """One failure-log WARNING per attempt: the retry's with its traceback, the dead letter's."""
    lines = _records(caplog, spec.lane)
    assert [(r.name, r.levelno) for r in lines] == [(FAILURES, logging.WARNING)] * 2, [
        r.getMessage() for r in lines
    ]
    first, final = (r.getMessage() for r in lines)
    head, *trace = first.splitlines()
    assert head.startswith(f"lane {spec.lane}: handler failed on {spec.name}[0]@0 (key k-1,")
    assert f"attempt 1 of 2): {raised}; next: retry tier {spec.name}.retry.100ms" in head
    assert trace[0] == "Traceback (most recent call last):"
    assert f"in {frame}" in first
    assert f"{spec.name}.retry.100ms[0]@0 (key k-1, attempt 2 of 2): {raised};" in final
    assert f"next: dead letter (exhausted) (inspect: pipeline redrive {spec.dead_letter}" in final


async def test_an_async_long_work_handler_that_raises_is_told_by_the_failure_log(
    transport: Transport,
    redis: Redis,
    prefix: str,
    unique: str,
    lanes: Declare,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: RepeatFilter,
) -> None:
    """Two attempts, two WARNINGs of the failure log; the dead letter has no line besides."""
    del caplog_repeats  # the root handler's filter, as configure_logging puts it
    caplog.set_level(logging.INFO)
    spec = _long_lane(unique)
    await lanes(spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def transcribe(event: bytes, ctx: Context) -> None:
        ctx.heartbeat()
        raise RuntimeError(f"boom on {event!r}")

    await _send(transport, spec)
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 1)
    assert (member.stats.retried, member.stats.hung, member.stats.cancelled) == (1, 0, 0)
    _assert_failure_lines(caplog, spec, "RuntimeError: boom on b'x'", "transcribe")


async def test_a_cpu_long_work_handler_that_raises_is_told_by_the_failure_log(
    transport: Transport,
    redis: Redis,
    prefix: str,
    unique: str,
    lanes: Declare,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: RepeatFilter,
) -> None:
    """A ``cpu=True`` long-work handler's failures: the same lines, with the worker's frames."""
    del caplog_repeats
    caplog.set_level(logging.INFO)
    spec = _long_lane(unique)
    await lanes(spec)
    app = App([spec])
    app.handler(spec.lane, cpu=True, time_limit_s=120)(cpu_failing_app.crunch)
    await _send(transport, spec)
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 1, timeout_s=90)
    assert (member.stats.retried, member.stats.hung, member.stats.cancelled) == (1, 0, 0)
    _assert_failure_lines(caplog, spec, "ValueError: bad b b'x'", "inner_b")


@pytest.mark.parametrize("cleanup", ["returns", "raises"])
async def test_a_cancelled_long_work_run_is_one_info_line_not_a_failure(
    transport: Transport,
    redis: Redis,
    prefix: str,
    unique: str,
    lanes: Declare,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: RepeatFilter,
    cleanup: str,
) -> None:
    """A run cancelled while it runs ends ``cancelled``: one INFO line, no failure, no copy.

    Its handler's ``finally`` raising on the way out changes nothing but the line, which names
    that error: it was routed to the retry tier as the handler's failure, with a WARNING.
    """
    del caplog_repeats
    caplog.set_level(logging.INFO)
    spec = _long_lane(unique)
    await lanes(spec)
    app = App([spec])
    started = asyncio.Event()

    @app.handler(spec.lane)
    async def transcribe(event: bytes, ctx: Context) -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # long work, until it is stopped
        finally:
            if cleanup == "raises":
                raise RuntimeError("cleanup failed")

    await _send(transport, spec)
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        await started.wait()
        await app.cancel(redis, key="k-1", reason="user left", prefix=prefix)
        await eventually(lambda: member.stats.cancelled == 1)
    assert (member.stats.retried, member.stats.dead_lettered, member.stats.hung) == (0, 0, 0)
    lines = _records(caplog, spec.lane)
    assert [(r.name, r.levelno) for r in lines] == [(GATE, logging.INFO)], [
        r.getMessage() for r in lines
    ]
    (line,) = (r.getMessage() for r in lines)
    assert line.startswith(f"cancelled {spec.name}[0]@0 on lane {spec.lane} (stopped): user left")
    if cleanup == "raises":
        assert line.endswith("; its handler raised RuntimeError: cleanup failed as it stopped")
    else:
        assert line.endswith("user left")


async def test_a_hung_run_whose_handler_raises_as_it_stops_is_hung(
    transport: Transport,
    redis: Redis,
    prefix: str,
    unique: str,
    lanes: Declare,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: RepeatFilter,
) -> None:
    """Stopped as hung, a handler that raises on its way out is hung: counted, its line, retried.

    Before, its exception was routed as an ordinary failure: hung neither counted nor told.
    """
    del caplog_repeats
    caplog.set_level(logging.INFO)
    spec = _long_lane(unique)
    await lanes(spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def transcribe(event: bytes, ctx: Context) -> None:
        ctx.heartbeat()  # from now on only its own beats count
        if ctx.attempt == 1:
            try:
                await asyncio.Event().wait()  # stuck on a dependency that never answers
            finally:
                raise RuntimeError("cleanup failed")

    await _send(transport, spec)
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.handled == 1)
    assert (member.stats.hung, member.stats.retried, member.stats.cancelled) == (1, 1, 0)
    lines = _records(caplog, spec.lane)
    assert [(r.name, r.levelno) for r in lines] == [(GATE, logging.WARNING)], [
        r.getMessage() for r in lines
    ]
    (line,) = (r.getMessage() for r in lines)
    assert line.startswith(f"hung {spec.name}[0]@0 on lane {spec.lane}: silent past its heartbeat")
    assert line.endswith("; its handler raised RuntimeError: cleanup failed as it stopped")


@pytest.mark.parametrize("long", [True, False], ids=["long", "plain"])
async def test_a_handler_that_raises_cancelled_error_of_its_own_is_a_failure(
    transport: Transport,
    redis: Redis,
    prefix: str,
    unique: str,
    lanes: Declare,
    caplog: pytest.LogCaptureFixture,
    caplog_repeats: RepeatFilter,
    long: bool,
) -> None:
    """``CancelledError`` out of a handler whose run no one stopped is its failure: retried.

    A future it awaited was cancelled by someone else, say. Before, the error went up past the
    handler stage and ended the key lane's worker: the message neither routed nor told, left
    unfinished, and the member one worker short for good.
    """
    del caplog_repeats
    caplog.set_level(logging.INFO)
    spec = _long_lane(unique)
    if not long:
        spec = lane_spec(f"lw_{unique}", 1, retry={"tiers": ["100ms"], "max_attempts": 2})
    await lanes(spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def transcribe(event: bytes, ctx: Context) -> None:
        if ctx.attempt == 1:
            raise asyncio.CancelledError("its own")

    await _send(transport, spec)
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.handled == 1)
    assert (member.stats.retried, member.stats.hung, member.stats.cancelled) == (1, 0, 0)
    lines = _records(caplog, spec.lane)
    assert [(r.name, r.levelno) for r in lines] == [(FAILURES, logging.WARNING)], [
        r.getMessage() for r in lines
    ]
    head = lines[0].getMessage().splitlines()[0]
    assert f"handler failed on {spec.name}[0]@0 (key k-1, attempt 1 of 2): " in head
    assert "HandlerCancelled: CancelledError (its own) raised by the handler itself;" in head
    assert f"next: retry tier {spec.name}.retry.100ms" in head
