"""A debounced lane's running turns are the busy handler slots its members report.

A debounced message is committed once it is buffered, so the lane's lag and age stay 0 however
many turns run or wait; its handler runs in the lane's turn runner, not in the member's message
slots. ``pipeline_worker_slots_busy`` and ``pipeline_worker_slots`` (the KEDA slot trigger,
``PipelineWorkerSlotsSaturated``) must count the turn runner's slots, or the lane's load is
invisible to both.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from runtime.helpers import (
    FAST,
    QUIET,
    Said,
    declare,
    eventually,
    lane_spec,
    produce,
    running,
    said,
)

from pipeline.config import PressureSettings
from pipeline.observability.facades import RuntimeMetrics
from pipeline.observability.metrics import Metrics
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

SLOTS = 2
"""The member's max_concurrency: the turn runner runs at most this many turns at once."""
# The machine's CPU pressure would shrink the message slots (pipeline/runtime/pressure.py): off
# here, so the totals are the configured ones whatever else the machine runs.
SETTINGS = FAST.model_copy(
    update={"max_concurrency": SLOTS, "pressure": PressureSettings(enabled=False)}
)


def gauge(metrics: Metrics, name: str) -> float | None:
    """The member's sample of an unlabelled gauge."""
    return metrics.registry.get_sample_value(name, {})


async def test_running_turns_are_busy_slots_of_the_turn_runner(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Three conversations due, two turns held running: 2 of 2 slots busy, the third waits.

    The member runs only the debounced lane, so its slots are the turn runner's
    (max_concurrency); once the turns are let go, none is busy.
    """
    spec = lane_spec(f"turnslots_{unique}", 1, debounce=QUIET)
    await declare(transport, spec)
    app = App([spec])
    started: list[str] = []
    release = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(events: list[Said], ctx: Context) -> None:
        started.append(events[0].conversation_id)
        await release.wait()

    await produce(transport, spec.name, [said(c, 0) for c in ("c1", "c2", "c3")])
    metrics = Metrics()
    member = Member(
        app,
        transport,
        f"g-{unique}",
        SETTINGS,
        redis=redis,
        redis_prefix=f"t{unique}",
        metrics=RuntimeMetrics(metrics),
    )
    async with running(member):
        await eventually(lambda: len(started) == SLOTS)
        await eventually(lambda: gauge(metrics, "pipeline_worker_slots_busy") == SLOTS)
        assert gauge(metrics, "pipeline_worker_slots") == SLOTS
        assert gauge(metrics, "pipeline_worker_slot_utilization_ratio") == 1.0
        assert len(started) == SLOTS  # the third turn is due and waits for a slot
        release.set()
        await eventually(lambda: member.stats.handled == 3)
        await eventually(lambda: gauge(metrics, "pipeline_worker_slots_busy") == 0)
    assert sorted(started) == ["c1", "c2", "c3"]


async def test_a_member_of_plain_and_debounced_lanes_has_the_slots_of_both(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Message slots and turn slots add up: a running message and a running turn are 2 busy."""
    turns = lane_spec(f"turnslotsd_{unique}", 1, debounce=QUIET)
    plain = lane_spec(f"turnslotsp_{unique}", 1)
    await declare(transport, turns, plain)
    app = App([turns, plain])
    ran: list[str] = []
    release = asyncio.Event()

    @app.handler(turns.lane)
    async def handle_turn(events: list[Said], ctx: Context) -> None:
        ran.append("turn")
        await release.wait()

    @app.handler(plain.lane)
    async def handle_message(event: bytes, ctx: Context) -> None:
        ran.append("message")
        await release.wait()

    await produce(transport, turns.name, [said("c1", 0)])
    await produce(transport, plain.name, [said("k1", 0)])
    metrics = Metrics()
    member = Member(
        app,
        transport,
        f"g-{unique}",
        SETTINGS,
        redis=redis,
        redis_prefix=f"t{unique}",
        metrics=RuntimeMetrics(metrics),
    )
    async with running(member):
        await eventually(lambda: sorted(ran) == ["message", "turn"])
        await eventually(lambda: gauge(metrics, "pipeline_worker_slots_busy") == 2)
        assert gauge(metrics, "pipeline_worker_slots") == 2 * SLOTS
        release.set()
        await eventually(lambda: member.stats.handled == 2)
