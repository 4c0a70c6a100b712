"""A member reports its deliveries, retries and dead letters as Prometheus metrics."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline.config import PressureSettings
from pipeline.envelope import Record
from pipeline.errors import DeadLetter, Retry
from pipeline.observability.facades import RuntimeMetrics
from pipeline.observability.metrics import Metrics
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.runtime.progress import ParkedKeysSource
from pipeline.transport.protocol import Transport


async def test_deliveries_retries_and_dead_letters_are_counted(
    transport: Transport, unique: str
) -> None:
    """Each outcome, retry tier and dead-letter reason shows up in the member's registry."""
    spec = lane_spec(f"metrics_{unique}", 1, ordered=False, retry={"tiers": ["100ms"]})
    await declare(transport, spec)
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"flaky" and ctx.attempt == 1:
            raise Retry("try again")
        if event == b"bad":
            raise DeadLetter("cannot be handled")

    producer = transport.producer()
    await producer.send_many(
        spec.name, [Record(b"ok", b"a"), Record(b"flaky", b"b"), Record(b"bad", b"c")]
    )
    await producer.close()
    metrics = Metrics()
    # The machine's CPU pressure would shrink the slots (pipeline/runtime/pressure.py): off here,
    # so the slot gauge shows the configured limit whatever else the machine runs.
    settings = FAST.model_copy(update={"pressure": PressureSettings(enabled=False)})
    member = Member(app, transport, f"g-{unique}", settings, metrics=RuntimeMetrics(metrics))
    async with running(member):
        await eventually(lambda: member.stats.handled == 2 and member.stats.dead_lettered == 1)
    value = metrics.registry.get_sample_value
    lane = spec.lane
    assert value("pipeline_deliveries_total", {"lane": lane, "outcome": "handled"}) == 2
    assert value("pipeline_deliveries_total", {"lane": lane, "outcome": "retried"}) == 1
    assert value("pipeline_retries_total", {"lane": lane, "tier": "100ms"}) == 1
    # the one retry copy ran after its due time (never before): one lateness of at least zero
    assert value("pipeline_retry_lateness_seconds_count", {"lane": lane}) == 1
    assert value("pipeline_retry_lateness_seconds_sum", {"lane": lane}) >= 0
    assert value("pipeline_dead_letters_total", {"lane": lane, "reason": "fatal"}) == 1
    assert value("pipeline_worker_slots", {}) == FAST.max_concurrency


async def test_parked_keys_are_read_from_redis_and_shown_per_ordered_lane(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """``pipeline_parked_keys``: the keys parked behind a retry now, as Redis holds them.

    It was declared, and the runbook sends operators to it, but nothing wrote it.
    """
    spec = lane_spec(f"parkedkeys_{unique}", 1, retry={"tiers": ["1s"]})
    await declare(transport, spec)
    app = App([spec])
    release = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"fails" and ctx.attempt == 1:
            raise Retry("parks its key")
        if ctx.attempt > 1:
            await release.wait()  # the key stays parked until the copy ran

    await produce(
        transport,
        spec.name,
        [Record(b"fails", b"a"), Record(b"follows", b"a"), Record(b"ok", b"b")],
    )
    metrics = Metrics()
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    source = ParkedKeysSource(member, RuntimeMetrics(metrics))
    shown = {"lane": spec.lane}

    async def parked() -> float | None:
        await source.refresh()
        return metrics.registry.get_sample_value("pipeline_parked_keys", shown)

    async with running(member):
        await eventually(lambda: member.stats.retried == 1)
        assert await parked() == 1  # key a, behind its copy in the tier
        release.set()
        await eventually(lambda: member.stats.handled == 3)
        while await parked() != 0:  # noqa: ASYNC110 - polls Redis: unparked once the follower ends
            await asyncio.sleep(0.05)
