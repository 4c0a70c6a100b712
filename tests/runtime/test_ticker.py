"""Periodic ticks expire at their cadence: a backed-up lane drops stale ticks, never runs them."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, running

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.runtime.ticker import Ticker
from pipeline.transport.protocol import Transport


async def test_two_replicas_produce_each_tick_once(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Ticks are claimed in Redis, so two tickers on one job produce each tick once."""
    spec = lane_spec(f"tickonce_{unique}", 1)
    await declare(transport, spec)
    producer = transport.producer()

    def fan_out(tick_ms: int) -> list[Record]:
        return [Record(b"%d" % tick_ms, b"job")]

    first, second = (
        Ticker(producer, spec.name, 1.0, fan_out, redis=redis, prefix=f"t{unique}")
        for _ in range(2)
    )
    for tick_ms in (1_000, 2_000, 3_000):
        await asyncio.gather(first.tick(tick_ms), second.tick(tick_ms))
    await producer.close()
    assert first.produced + second.produced == 3
    assert first.skipped + second.skipped == 3


async def test_ticks_that_waited_past_their_cadence_are_dropped_and_counted(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Ticks every 1 s with 2.5 s of work each: stale ticks are dropped, none starts late.

    Late by the member's own clock (Redis's, through the offset it measured), which judged the
    deadline a moment before: the host's is off it by up to half that measurement's round trip,
    so a tick started just inside its deadline could read as late on a loaded machine.
    """
    spec = lane_spec(f"tick_{unique}", 1)
    await declare(transport, spec)
    app = App([spec])
    late_starts: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        deadline_ms = int(ctx.message.headers[h.DEADLINE_MS])
        if member._clock.now_ms() > deadline_ms:
            late_starts.append(deadline_ms)
        await asyncio.sleep(2.5)  # each tick's work takes longer than the cadence

    producer = transport.producer()
    ticker = Ticker(producer, spec.name, 1.0, lambda t: [Record(b"%d" % t, b"job")])
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    stop_ticking = asyncio.Event()
    async with running(member):
        await eventually(lambda: bool(member.assignment))
        ticking = asyncio.create_task(ticker.run(stop_ticking))
        await eventually(lambda: ticker.produced == 4)
        stop_ticking.set()
        await ticking
        await eventually(lambda: member.stats.handled + member.stats.expired == 4)
    await producer.close()
    assert member.stats.expired >= 1
    assert late_starts == []
