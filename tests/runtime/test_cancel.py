"""Cancellation on both transports: running, queued, retry-tier and parked work of a key."""

from __future__ import annotations

import asyncio
import time

from redis.asyncio import Redis
from runtime.helpers import eventually, lane_spec, running
from runtime.owned import Declare

from pipeline import headers as h
from pipeline.cancel.keys import CancelKeys
from pipeline.config import RuntimeSettings
from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

QUICK = RuntimeSettings(commit_interval_ms=100, shutdown_grace_s=5.0, cancel_poll_ms=50)


async def test_every_state_of_a_keys_work_is_cancelled_and_none_runs_after(
    transport: Transport, redis: Redis, prefix: str, unique: str, lanes: Declare
) -> None:
    """Running, queued, retry-tier and parked messages of a key end cancelled, never run."""
    spec = lane_spec(f"cancel_{unique}", 1, retry={"tiers": ["1s"]})
    await lanes(spec)
    app = App([spec])
    ran: list[tuple[bytes, int]] = []
    started = asyncio.Event()
    seen_cancelled: list[bool] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        ran.append((event, ctx.attempt))
        if event == b"block":
            started.set()
            try:
                await asyncio.Event().wait()  # until the cancellation reaches it
            finally:
                seen_cancelled.append(ctx.cancelled)
        if event == b"fail":
            raise RuntimeError("flaky dependency")

    producer = transport.producer()
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        # A running handler and two messages queued behind it in the key's lane.
        await producer.send_many(
            spec.name, [Record(b"block", b"K"), Record(b"q1", b"K"), Record(b"q2", b"K")]
        )
        await asyncio.wait_for(started.wait(), 60)
        await app.cancel(redis, key="K", reason="user closed the tab", prefix=prefix)
        await eventually(lambda: member.stats.cancelled == 3)
        assert seen_cancelled == [True]
        # A retry-tier message (its first attempt failed) and a follower parked behind it.
        await producer.send(spec.name, b"fail", key=b"K")
        await eventually(lambda: member.stats.retried == 1)
        await producer.send(spec.name, b"parked", key=b"K")
        await eventually(lambda: member.stats.parked == 1)
        await app.cancel(redis, key="K", prefix=prefix)
        cancelled_ms = time.time() * 1000
        await eventually(lambda: member.stats.cancelled == 5)
        # Work of the key produced after the cancellation's millisecond is new work: it runs.
        await eventually(lambda: time.time() * 1000 > cancelled_ms + 1)
        await producer.send(spec.name, b"later", key=b"K")
        await eventually(lambda: member.stats.handled == 1)
    await producer.close()
    assert ran == [(b"block", 1), (b"fail", 1), (b"later", 1)]
    counts = await redis.hgetall(CancelKeys(prefix).counts)
    assert counts == {f"{spec.lane}:cancelled".encode(): b"5"}


async def test_abandoned_event_and_tenant_cancellations_spare_other_lanes(
    transport: Transport, redis: Redis, prefix: str, unique: str, lanes: Declare
) -> None:
    """Abandoned, event-id and tenant cancellations skip their messages; other lanes run."""
    first, second = lane_spec(f"ab1_{unique}", 1), lane_spec(f"ab2_{unique}", 1)
    await lanes(first, second)
    app = App([first, second])
    ran: list[bytes] = []

    async def handle(event: bytes, ctx: Context) -> None:
        ran.append(event)

    app.handler(first.lane)(handle)
    app.handler(second.lane)(handle)
    producer = transport.producer()
    acme = {h.TENANT: b"acme"}
    await producer.send(first.name, b"gone", key=b"a", headers={h.ABANDON_AFTER_MS: b"1"})
    await producer.send(first.name, b"acme-1", key=b"b", headers=acme)
    await producer.send(second.name, b"acme-2", key=b"b", headers=acme)
    await producer.send(second.name, b"evt", key=b"c", headers={h.EVENT_ID: b"evt-9"})
    await producer.close()
    await app.cancel(redis, tenant="acme", lane=first.lane, prefix=prefix)
    await app.cancel(redis, event="evt-9", prefix=prefix)
    member = Member(app, transport, f"g-{unique}", QUICK, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: member.stats.cancelled == 3 and member.stats.handled == 1)
    assert ran == [b"acme-2"]
