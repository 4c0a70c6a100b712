"""Whose clock says a run of long work fell silent: Redis's, not the beating or judging member's.

Two members on one Redis: the runner runs a long run and beats for it, the watcher's reconciler
judges it. One of them is on a host whose clock is a minute off (``time.time`` shifted for that
member's tasks only, with a context variable, as a skewed host would see it; its monotonic clock
is untouched).
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from runtime.helpers import RecordedFailures
from skewed_hosts import on_host

from pipeline import headers as h
from pipeline.cancel.functions import CancelFunctions
from pipeline.cancel.keys import CancelKeys
from pipeline.envelope import Message
from pipeline.runtime import App, Context
from pipeline.runtime.app import Lane
from pipeline.runtime.liveness import HandlerHung, heartbeat
from pipeline.runtime.longwork import LongWork
from pipeline.runtime.shared_clock import SharedClock
from pipeline.runtime.stats import Stats
from pipeline.topics.spec import TopicSpec

SKEW_S = 60.0
LIVE_TIMEOUT_MS = 10_000
"""A healthy run's timeout: far longer than the test takes, far shorter than the skew."""
SILENT_TIMEOUT_MS = 300
"""A silent run's timeout: the test waits it out (in Redis's time)."""


def _lane(unique: str, timeout_ms: int) -> Lane:
    spec = TopicSpec.model_validate(
        {"name": f"beatclock_{unique}", "partitions": 1, "heartbeat_timeout": f"{timeout_ms}ms"}
    )
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:  # the lane needs one; not called
        return None

    return app.lanes[spec.lane]


def _member(
    redis: Redis,
    prefix: str,
    lane: Lane,
    routing: RecordedFailures,
    started: asyncio.Event,
    *,
    silent: bool,
) -> LongWork:
    """A member whose one run never ends; ``silent``: it beats once on its own, then never."""

    async def call(lane: Lane, message: Message) -> str | None:
        if silent:
            heartbeat()  # from now on only its own beats count, and there are none
        started.set()
        await asyncio.Event().wait()
        return "handled"

    return LongWork(
        call,
        routing,  # type: ignore[arg-type]
        Stats(),
        [lane],
        functions=CancelFunctions(redis, prefix),
        poll_s=0.0,  # judges from its first tick on (the test ticks it itself)
    )


async def _redis_ms(redis: Redis) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.parametrize(
    ("runner_skew_s", "watcher_skew_s"),
    [(0.0, SKEW_S), (-SKEW_S, 0.0)],
    ids=["judge-ahead", "beater-behind"],
)
async def test_a_live_run_is_not_hung_whatever_the_hosts_clocks(
    redis: Redis,
    prefix: str,
    unique: str,
    skewable: None,
    runner_skew_s: float,
    watcher_skew_s: float,
) -> None:
    """A run that beats on every tick is left alone by a member whose clock is a minute off."""
    lane = _lane(unique, LIVE_TIMEOUT_MS)
    routing = RecordedFailures()
    started = asyncio.Event()
    runner = _member(redis, prefix, lane, routing, started, silent=False)
    watcher = _member(redis, prefix, lane, routing, asyncio.Event(), silent=False)
    with on_host(runner_skew_s):
        run = asyncio.create_task(runner(lane, Message(lane.name, 0, 0, b"k", b"v")))
    try:
        await asyncio.wait_for(started.wait(), 10)
        with on_host(runner_skew_s):
            await runner.tick()  # registers the run and beats for it
        assert await redis.hlen(CancelKeys(prefix).runs) == 1
        with on_host(watcher_skew_s):
            await watcher.tick()  # judges it
        with on_host(runner_skew_s):
            await runner.tick()  # would stop it, were it told to
        assert await redis.hgetall(CancelKeys(prefix).stops) == {}
        assert routing.failures == []
        assert not run.done()
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


@pytest.mark.parametrize(
    ("runner_skew_s", "watcher_skew_s"),
    [(0.0, -SKEW_S), (SKEW_S, 0.0)],
    ids=["judge-behind", "beater-ahead"],
)
async def test_a_silent_run_is_hung_whatever_the_hosts_clocks(
    redis: Redis,
    prefix: str,
    unique: str,
    skewable: None,
    runner_skew_s: float,
    watcher_skew_s: float,
) -> None:
    """A run silent past its timeout (by Redis's clock) is found hung by a member a minute off."""
    lane = _lane(unique, SILENT_TIMEOUT_MS)
    routing = RecordedFailures()
    started = asyncio.Event()
    runner = _member(redis, prefix, lane, routing, started, silent=True)
    watcher = _member(redis, prefix, lane, routing, asyncio.Event(), silent=False)
    with on_host(runner_skew_s):
        run = asyncio.create_task(runner(lane, Message(lane.name, 0, 0, b"k", b"v")))
    try:
        await asyncio.wait_for(started.wait(), 10)
        with on_host(runner_skew_s):
            await runner.tick()  # registers the run with its one beat
        # Redis's time passes the real beat plus the timeout (the beat's age is under a tick).
        silent_from = await _redis_ms(redis) + SILENT_TIMEOUT_MS
        while await _redis_ms(redis) <= silent_from:
            continue  # each turn asks Redis its time again
        with on_host(watcher_skew_s):
            await watcher.tick()  # judges it hung
        assert await redis.hgetall(CancelKeys(prefix).stops) != {}
        with on_host(runner_skew_s):
            await runner.tick()  # stops it
        assert await asyncio.wait_for(run, 10) == "retried"
        assert [type(e) for e in routing.failures] == [HandlerHung]
    finally:
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)


async def test_members_a_minute_apart_agree_when_work_is_abandoned(
    redis: Redis, prefix: str, unique: str, skewable: None
) -> None:
    """``pl-abandon-after-ms`` is judged by the shared clock (Redis's), not the member's host's."""
    lane = _lane(unique, LIVE_TIMEOUT_MS)
    ran: list[bytes] = []

    async def call(lane: Lane, message: Message) -> str | None:
        ran.append(message.value)
        return "handled"

    with on_host(SKEW_S):
        clock = SharedClock(redis)
        assert await clock.measure()
        member = LongWork(
            call,
            RecordedFailures(),  # type: ignore[arg-type]
            Stats(),
            [lane],
            functions=CancelFunctions(redis, prefix),
            poll_s=0.0,
            clock_ms=clock.now_ms,
        )
        now = await _redis_ms(redis)
        for value, abandon_ms in ((b"waited-for", now + SKEW_S * 500), (b"given-up", now - 1)):
            headers = {h.ABANDON_AFTER_MS: str(int(abandon_ms)).encode()}
            message = Message(lane.name, 0, 0, b"k", value, headers)
            await member(lane, message)
    assert ran == [b"waited-for"]
