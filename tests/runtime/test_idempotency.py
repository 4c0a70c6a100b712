"""The idempotency guard against real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pipeline.errors import Retry
from pipeline.runtime.idempotency import IdempotencyGuard
from pipeline.runtime.keys import once_key
from pipeline.runtime.once_functions import OnceFunctions


@pytest.fixture
async def guard(redis_service: str, unique: str) -> AsyncIterator[IdempotencyGuard]:
    """A guard under a test-private prefix."""
    client = Redis.from_url(redis_service)
    yield IdempotencyGuard(client, f"t{unique}", lease_ms=2_000)
    await client.aclose()


async def test_a_succeeded_effect_does_not_run_again(guard: IdempotencyGuard) -> None:
    """The second delivery of an event skips an effect the first one completed."""
    calls: list[int] = []

    async def effect() -> str:
        calls.append(1)
        return "sent"

    assert await guard.once("lane", "evt-1", "reply", effect) == "sent"
    assert await guard.once("lane", "evt-1", "reply", effect) is None
    assert await guard.once("lane", "evt-2", "reply", effect) == "sent"
    assert len(calls) == 2


async def test_a_failed_effect_may_run_again(guard: IdempotencyGuard) -> None:
    """An effect that raised leaves no record, so a retry runs it."""
    attempts: list[int] = []

    async def effect() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("timeout")

    with pytest.raises(RuntimeError):
        await guard.once("lane", "evt-1", "reply", effect)
    await guard.once("lane", "evt-1", "reply", effect)
    assert len(attempts) == 2


async def test_two_deliveries_never_run_it_at_once(guard: IdempotencyGuard) -> None:
    """While one delivery keeps running the effect, a concurrent one is told to retry later."""
    inside, release = asyncio.Event(), asyncio.Event()

    async def slow() -> None:
        inside.set()
        await release.wait()

    first = asyncio.create_task(guard.once("lane", "evt-1", "charge", slow))
    await asyncio.wait_for(inside.wait(), 10)
    with pytest.raises(Retry, match="running in another delivery"):
        await guard.once("lane", "evt-1", "charge", slow)
    release.set()
    await first


async def test_a_concurrent_delivery_waits_for_the_first_to_finish(guard: IdempotencyGuard) -> None:
    """A second delivery waits out a short run and then skips the effect, with no retry."""
    inside, release = asyncio.Event(), asyncio.Event()
    calls: list[int] = []

    async def effect() -> None:
        calls.append(1)
        inside.set()
        await release.wait()

    first = asyncio.create_task(guard.once("lane", "evt-1", "charge", effect))
    await asyncio.wait_for(inside.wait(), 10)
    second = asyncio.create_task(guard.once("lane", "evt-1", "charge", effect))
    release.set()
    await first
    assert await second is None
    assert calls == [1]


async def test_a_dead_holders_claim_lapses_and_the_next_delivery_runs_it(
    guard: IdempotencyGuard, redis_service: str, unique: str
) -> None:
    """A claim whose holder died (never settled, never renewed) passes on within a lease."""
    # Plant the claim of a holder that died, the way a delivery claims it.
    key = once_key(f"t{unique}", "lane", "evt-1", "charge")
    client = Redis.from_url(redis_service)
    try:
        assert await OnceFunctions(client).claim(key, "dead-holder", 500) == "claimed"
    finally:
        await client.aclose()
    calls: list[int] = []

    async def effect() -> str:
        calls.append(1)
        return "charged"

    assert await guard.once("lane", "evt-1", "charge", effect) == "charged"
    assert calls == [1]
