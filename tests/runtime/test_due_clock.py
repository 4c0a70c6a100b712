"""Whose clock says a retry is due: Redis's, not the failing member's nor the reading member's.

A member on a host whose clock is a minute off (simulated by patching ``time.time`` for that
member's tasks only, as a skewed host would see it: its monotonic clock is untouched) fails a
message once; a member with a correct clock reads the retry copy it wrote. Two consumer groups
on one lane, so both members run at once and the reader is not the writer: the writer's group
fails the first delivery, the reader's group records when the copy ran, in Redis ``TIME``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from runtime.helpers import FAST, lane_spec, produce
from runtime.owned import Declare
from skewed_hosts import on_host
from support import delete_group_after

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.errors import Retry
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.runtime.shared_clock import SharedClock
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

SKEW_S = 60.0
TIER = "2s"
"""The first tier: a delay of 1 to 2 s (jittered between half and all of it)."""
SLACK_MS = 250
"""What two members' offsets to Redis's clock may each be off by (half the quickest of three
round trips: a fraction of a millisecond on localhost, more on a loaded machine) and the
milliseconds the times are cut to; far below the minute of skew the tests tell apart."""
LATE_BOUND_MS = 5_000
"""How late past its due time the copy may run (fetch, poll, a busy machine)."""
WAIT_S = 20.0
"""How long the test waits for the copy: well below the minute a skewed due time would add."""


@dataclass
class Seen:
    """What the two members saw of the message, in Redis ``TIME`` ms."""

    failed_ms: int = 0
    """When the writer's handler failed its first delivery."""
    ran_ms: int = 0
    """When the reader's handler started the retry copy."""
    delay_ms: int = 0
    """The delay the writer gave the copy (its ``pl-due-ms`` less its ``pl-last-failure-ms``)."""
    ran: asyncio.Event = field(default_factory=asyncio.Event)


async def _redis_ms(redis: Redis) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _writer(spec: TopicSpec, redis: Redis, seen: Seen) -> App:
    """Fails the first delivery once (its own retry copy then succeeds)."""
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if ctx.attempt == 1:
            seen.failed_ms = await _redis_ms(redis)
            raise Retry("a flapping dependency")

    return app


def _reader(spec: TopicSpec, redis: Redis, seen: Seen) -> App:
    """Handles the first delivery; records when the writer's retry copy ran."""
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if ctx.attempt > 1:
            seen.ran_ms = await _redis_ms(redis)
            headers = ctx.message.headers
            seen.delay_ms = h.int_header(headers, h.DUE_MS) - h.int_header(
                headers, h.LAST_FAILURE_MS
            )
            seen.ran.set()

    return app


@dataclass
class TwoGroups:
    """The lane, its two groups and the two members' key prefixes."""

    spec: TopicSpec
    transport: Transport
    redis: Redis
    groups: tuple[str, str]
    prefixes: tuple[str, str]


@pytest.fixture
async def lane(
    transport: Transport, redis: Redis, unique: str, lanes: Declare
) -> AsyncIterator[TwoGroups]:
    """A one-partition lane with a 2 s tier and a 5 min one; every key of both members deleted."""
    spec = lane_spec(
        f"dueclock_{unique}", 1, ordered=False, retry={"tiers": [TIER, "5m"], "max_attempts": 3}
    )
    await lanes(spec)
    groups = (f"g-{unique}", f"g-{unique}-reader")
    delete_group_after(transport, groups[1], spec.topic_names())
    prefixes = (f"tw{unique}", f"tr{unique}")
    yield TwoGroups(spec, transport, redis, groups, prefixes)
    for name in prefixes:
        left = [key async for key in redis.scan_iter(f"{{{name}:*")]
        left += [key async for key in redis.scan_iter(f"{name}:*")]
        if left:
            await redis.delete(*left)


async def _copy_seen_by_reader(lane: TwoGroups, skew_s: float) -> Seen:
    """Run the writer ``skew_s`` off and the reader on time, until the reader ran the copy."""
    seen = Seen()
    writer = Member(
        _writer(lane.spec, lane.redis, seen),
        lane.transport,
        lane.groups[0],
        FAST,
        redis=lane.redis,
        redis_prefix=lane.prefixes[0],
    )
    reader = Member(
        _reader(lane.spec, lane.redis, seen),
        lane.transport,
        lane.groups[1],
        FAST,
        redis=lane.redis,
        redis_prefix=lane.prefixes[1],
    )
    stop = asyncio.Event()
    with on_host(skew_s):  # the writer's tasks, and every task they start, see its clock
        writing = asyncio.create_task(writer.run(stop))
    reading = asyncio.create_task(reader.run(stop))
    try:
        await asyncio.wait_for(asyncio.gather(writer.polling.wait(), reader.polling.wait()), WAIT_S)
        await produce(lane.transport, lane.spec.name, [Record(b"m", b"k")])
        await asyncio.wait_for(seen.ran.wait(), WAIT_S)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(writing, reading), 60)
    assert writer.stats.retried == 1
    return seen


async def test_a_retry_written_by_a_member_whose_clock_is_behind_does_not_run_at_once(
    lane: TwoGroups, skewable: None
) -> None:
    """A copy a minute-behind member wrote waits its delay of Redis time on a correct member."""
    seen = await _copy_seen_by_reader(lane, -SKEW_S)
    assert 1000 <= seen.delay_ms <= 2000
    assert seen.ran_ms - seen.failed_ms >= seen.delay_ms - SLACK_MS


async def test_a_retry_written_by_a_member_whose_clock_is_ahead_runs_at_its_delay(
    lane: TwoGroups, skewable: None
) -> None:
    """A copy a minute-ahead member wrote runs after its delay on a correct member, not later."""
    seen = await _copy_seen_by_reader(lane, SKEW_S)
    assert 1000 <= seen.delay_ms <= 2000
    waited_ms = seen.ran_ms - seen.failed_ms
    assert seen.delay_ms - SLACK_MS <= waited_ms <= seen.delay_ms + LATE_BOUND_MS


async def test_the_shared_clock_reads_redis_time_whatever_the_hosts_clock(
    redis: Redis, skewable: None
) -> None:
    """Measured on a host a minute behind, or stepped a minute after, it still reads Redis's."""
    clock = SharedClock(redis)
    with on_host(-SKEW_S):
        assert await clock.measure()
        before = await _redis_ms(redis)
        now = clock.now_ms()
        after = await _redis_ms(redis)
        assert before - SLACK_MS <= now <= after + SLACK_MS
    before = await _redis_ms(redis)  # the host's clock was put right: nothing moves
    now = clock.now_ms()
    after = await _redis_ms(redis)
    assert before - SLACK_MS <= now <= after + SLACK_MS


class _Unreachable:
    """Redis's ``TIME`` through a real client until the connection is lost (``lost``)."""

    def __init__(self, redis: Redis) -> None:
        """Answer through ``redis``."""
        self._redis = redis
        self.lost = False

    async def time(self) -> tuple[int, int]:
        """``TIME``, or the error redis-py raises for a dropped connection."""
        if self.lost:
            raise RedisConnectionError("Connection closed by server.")
        return await self._redis.time()


async def test_a_failed_refresh_keeps_the_last_offset_and_is_logged_once(
    redis: Redis, caplog: pytest.LogCaptureFixture, skewable: None
) -> None:
    """Redis lost: the clock keeps Redis's time through the measured offset, one warning said."""
    flaky = _Unreachable(redis)
    clock = SharedClock(flaky)  # type: ignore[arg-type]
    with on_host(SKEW_S):  # a host a minute ahead
        assert await clock.measure()
        caplog.clear()
        flaky.lost = True
        with caplog.at_level(logging.WARNING, "pipeline.runtime.shared_clock"):
            assert not await clock.measure()
            assert not await clock.measure()
        assert len(caplog.records) == 1
        assert clock.now_ms() - await _redis_ms(redis) < SLACK_MS
        assert await _redis_ms(redis) - clock.now_ms() < SLACK_MS


async def test_without_redis_the_clock_is_the_hosts() -> None:
    """A bare member's clock: ``time.time``, looked up at each reading (a test clock applies)."""
    clock = SharedClock()
    assert not await clock.measure()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: 1_000.0)
        assert clock.now_ms() == 1_000_000
