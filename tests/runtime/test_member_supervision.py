"""A member whose essential background task fails stops, with one line, instead of running on."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually, lane_spec
from runtime.owned import Declare

from pipeline.config import RuntimeSettings
from pipeline.envelope import Record
from pipeline.errors import PipelineError
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

QUICK = RuntimeSettings(commit_interval_ms=100, shutdown_grace_s=5.0, cancel_poll_ms=50)


class BrokenCost:
    """A deletion-cost sink with a bug: publishing any long work raises."""

    def __init__(self) -> None:
        """Nothing published yet."""
        self.calls = 0

    async def update(self, in_flight: int, *, force: bool = False) -> bool:  # noqa: ARG002
        """Raise for a count above zero (a bug), accept zero."""
        self.calls += 1
        if in_flight:
            raise RuntimeError("bug in the deletion cost")
        return True

    async def close(self) -> None:
        """Nothing to release."""


async def test_a_member_whose_long_work_tick_dies_stops_with_one_line(
    transport: Transport,
    redis: Redis,
    prefix: str,
    unique: str,
    lanes: Declare,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The long-work tick raising ends the member with a PipelineError, logged with a traceback."""
    spec = lane_spec(f"sup_{unique}", 1, heartbeat_timeout="30s")
    await lanes(spec)
    app = App([spec])
    release = asyncio.Event()
    started = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        started.set()
        await release.wait()

    member = Member(
        app,
        transport,
        f"g-{unique}",
        QUICK,
        redis=redis,
        redis_prefix=prefix,
        deletion_cost=BrokenCost(),  # type: ignore[arg-type]
    )
    stop = asyncio.Event()
    producer = transport.producer()
    with caplog.at_level(logging.ERROR, logger="pipeline.runtime.supervision"):
        task = asyncio.create_task(member.run(stop))
        try:
            await producer.send_many(spec.name, [Record(b"a", b"1")])
            await eventually(lambda: task.done() or bool(caplog.records), timeout_s=30.0)
            assert caplog.records, "the failed tick was not logged while the member ran"
            release.set()
            with pytest.raises(PipelineError) as failed:
                await asyncio.wait_for(task, 30.0)
        finally:
            release.set()
            stop.set()
            await asyncio.wait([task], timeout=30.0)
            await producer.close()
    line = str(failed.value)
    assert "\n" not in line
    assert f"g-{unique}" in line
    assert "long-work tick" in line
    assert "RuntimeError: bug in the deletion cost" in line
    assert started.is_set()
    (record,) = caplog.records
    assert record.exc_info is not None
