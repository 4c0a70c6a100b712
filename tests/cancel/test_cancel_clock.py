"""Whose clock says when a cancellation happened: the Redis the messages' times come from."""

from __future__ import annotations

import json
import time

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually, lane_spec, running
from runtime.owned import Declare

from pipeline.cancel.keys import CancelKeys
from pipeline.config import RuntimeSettings
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

QUICK = RuntimeSettings(commit_interval_ms=100, shutdown_grace_s=5.0, cancel_poll_ms=50)
SKEW_S = 60.0


async def _cancel_with_clock_off(
    app: App, redis: Redis, prefix: str, key: str, skew_s: float
) -> None:
    """Cancel ``key`` from a process whose clock is ``skew_s`` off the others'."""
    real = time.time
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: real() + skew_s)
        await app.cancel(redis, key=key, prefix=prefix)


def _ms(server_time: tuple[int, int]) -> int:
    """Redis's TIME in ms."""
    return server_time[0] * 1000 + server_time[1] // 1000


@pytest.mark.parametrize("transport", ["redis"], indirect=True)
async def test_a_canceller_with_a_skewed_clock_covers_exactly_what_was_produced_before(
    transport: Transport,
    redis: Redis,
    prefix: str,
    unique: str,
    lanes: Declare,
) -> None:
    """On Redis Streams, work produced before a cancellation is cancelled and work after runs."""
    spec = lane_spec(f"clock_{unique}", 1)
    await lanes(spec)
    app = App([spec])
    ran: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        ran.append(event)

    producer = transport.producer()
    await producer.send(spec.name, b"before", key=b"A")
    await _cancel_with_clock_off(app, redis, prefix, "A", -SKEW_S)  # behind: "before" is earlier
    await _cancel_with_clock_off(app, redis, prefix, "B", SKEW_S)  # ahead: "after" is later
    # Work of the cancellation's own millisecond existed then: produce past it.
    entry = await redis.hget(CancelKeys(prefix).selectors, "key:*:B")
    at_ms = json.loads(entry or b"{}")["at"]
    while _ms(await redis.time()) <= at_ms:
        continue  # each turn asks Redis its time again
    await producer.send(spec.name, b"after", key=b"B")
    await producer.close()
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.cancelled + member.stats.handled == 2)
    assert ran == [b"after"]
    assert member.stats.cancelled == 1
