"""A ticker with Redis ticks by Redis's clock, not by its host's (which may run a minute ahead)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
from redis.asyncio import Redis

from pipeline.envelope import Record
from pipeline.runtime.ticker import Ticker

SKEW_S = 60.0
EVERY_S = 0.2


class _Producer:
    """Keeps what is sent (the ticker's other collaborator; its claims go to the real Redis)."""

    def __init__(self) -> None:
        self.sent: list[Record] = []
        self.arrived = asyncio.Event()

    async def send_many(self, topic: str, records: Sequence[Record]) -> None:  # noqa: ARG002
        self.sent.extend(records)
        self.arrived.set()


async def _redis_ms(redis: Redis) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.parametrize("skew_s", [SKEW_S, -SKEW_S], ids=["ahead", "behind"])
async def test_a_skewed_host_ticks_on_redis_time(
    redis: Redis, unique: str, monkeypatch: pytest.MonkeyPatch, skew_s: float
) -> None:
    """The tick's time and its deadline are Redis's, within a cadence of when it was produced.

    On the host's clock, a minute ahead, the tick was stamped a minute in the future (its
    deadline too, so a backed-up lane ran it a minute late instead of dropping it).
    """
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew_s)
    producer = _Producer()
    ticker = Ticker(
        producer,  # type: ignore[arg-type] # only send_many is used
        "jobs",
        EVERY_S,
        lambda t: [Record(b"%d" % t, b"job")],
        redis=redis,
        prefix=f"t{unique}",
    )
    stop = asyncio.Event()
    running = asyncio.create_task(ticker.run(stop))
    try:
        await asyncio.wait_for(producer.arrived.wait(), 10)
        produced_ms = await _redis_ms(redis)
    finally:
        stop.set()
        await running
        await redis.delete(*[k async for k in redis.scan_iter(f"t{unique}:*")])
    tick_ms = int(producer.sent[0].value)
    # Off by at most half a round trip to Redis (a loaded machine: some 100 ms), not a minute.
    assert produced_ms - 1000 <= tick_ms <= produced_ms + 250, (tick_ms, produced_ms)
