"""A retry copy is work of its original message's time: a cancellation covers it as it did that."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually, lane_spec, running
from runtime.owned import Declare

from pipeline import headers as h
from pipeline.cancel.keys import CancelKeys
from pipeline.cancel.target import facts_of
from pipeline.config import RuntimeSettings
from pipeline.envelope import Message
from pipeline.retry import router
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

QUICK = RuntimeSettings(commit_interval_ms=100, shutdown_grace_s=5.0, cancel_poll_ms=50)
LOOKS_WHEN_TOLD = RuntimeSettings(
    commit_interval_ms=100, shutdown_grace_s=5.0, cancel_poll_ms=3_600_000
)
"""A member that learns of cancellations at its start, then only when the test ticks it."""
BEHIND_S = 60.0


def _cancel_blocking(app: App, url: str, prefix: str, key: str) -> None:
    """Cancel ``key`` from another thread while this one waits: the member cannot look meanwhile."""

    async def cancel() -> None:
        client = Redis.from_url(url)
        try:
            await app.cancel(client, key=key, prefix=prefix)
        finally:
            await client.aclose()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, cancel()).result()


async def _past_cancel(redis: Redis, prefix: str, key: str) -> None:
    """Return once Redis's clock is past the millisecond of ``key``'s cancellation."""
    entry = await redis.hget(CancelKeys(prefix).selectors, f"key:*:{key}")
    at_ms = json.loads(entry or b"{}")["at"]
    while True:
        seconds, micros = await redis.time()
        if seconds * 1000 + micros // 1000 > at_ms:
            return


async def test_a_message_produced_before_a_cancel_does_not_run_again_from_its_retry_tier(
    transport: Transport,
    redis: Redis,
    redis_service: str,
    prefix: str,
    unique: str,
    lanes: Declare,
) -> None:
    """A message that failed after its key was cancelled, before the member saw it, is skipped."""
    spec = lane_spec(f"rc_{unique}", 1, retry={"tiers": ["2s"]})
    await lanes(spec)
    app = App([spec])
    ran: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        ran.append(ctx.attempt)
        if ctx.attempt == 1:
            _cancel_blocking(app, redis_service, prefix, "K")
            raise RuntimeError("failed after the cancel")

    producer = transport.producer()
    await producer.send(spec.name, b"m", key=b"K")
    await producer.close()
    member = Member(
        app, transport, f"g-{unique}", LOOKS_WHEN_TOLD, redis=redis, redis_prefix=prefix
    )
    async with running(member):
        await eventually(lambda: member.stats.retried == 1)
        await member._longwork.tick()  # the member learns of the cancellation only now
        await eventually(lambda: member.stats.cancelled + member.stats.handled >= 1)
    assert ran == [1]
    assert member.stats.cancelled == 1


@pytest.mark.parametrize("clock_behind_s", [0.0, BEHIND_S])
async def test_a_message_produced_after_a_cancel_runs_from_its_retry_tier(
    transport: Transport,
    redis: Redis,
    prefix: str,
    unique: str,
    lanes: Declare,
    clock_behind_s: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """New work of a cancelled key that fails once runs again, even if the member's clock lags."""
    real = time.time
    monkeypatch.setattr(router, "time", SimpleNamespace(time=lambda: real() - clock_behind_s))
    spec = lane_spec(f"ra_{unique}", 1, retry={"tiers": ["2s"]})
    await lanes(spec)
    app = App([spec])
    ran: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        ran.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("fails once")

    await app.cancel(redis, key="K", prefix=prefix)
    await _past_cancel(redis, prefix, "K")
    producer = transport.producer()
    await producer.send(spec.name, b"m", key=b"K")
    await producer.close()
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.cancelled + member.stats.handled >= 1)
    assert ran == [1, 2]
    assert member.stats.cancelled == 0


def _copy(produced_at: bytes, first_failure_ms: int, timestamp_ms: int) -> Message:
    """A retry copy written at ``timestamp_ms`` carrying ``produced_at``."""
    headers = {
        h.ORIGIN_TOPIC: b"lane",
        h.FIRST_FAILURE_MS: str(first_failure_ms).encode(),
        h.PRODUCED_AT_MS: produced_at,
    }
    return Message("lane.retry.5s", 0, 7, b"K", b"", headers, timestamp_ms)


def test_a_retry_copy_is_as_old_as_its_original_production() -> None:
    """The copy's origin is the produced-at header, not its own time or the first failure's."""
    facts = facts_of(_copy(b"1000", 900, 5000), "e1")
    assert facts.origin_ms == 1000


@pytest.mark.parametrize(
    "produced_at", [b"soon", b"", b"-5", b"0", b"99999999999999999", b"\xff\xfe", b"9" * 5000]
)
def test_a_hostile_produced_at_falls_back_to_the_record_s_own_time(produced_at: bytes) -> None:
    """Not a number, not positive or later than the copy itself: ignored, never a crash."""
    facts = facts_of(_copy(produced_at, 4000, 5000), "e1")
    assert facts.origin_ms == 4000
