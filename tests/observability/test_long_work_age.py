"""A lane of long work: its oldest uncommitted message is the one running, not one waiting."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import yaml
from runtime.helpers import FAST, declare, eventually, held_app, produce, running

from pipeline.config import PressureSettings
from pipeline.envelope import Record
from pipeline.observability.facades import RuntimeMetrics
from pipeline.observability.lanes import lane_watches, probe_lane
from pipeline.observability.metrics import Metrics
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yaml"
GAUGE = "pipeline_long_work_heartbeat_timeout_seconds"


def _age_alerts() -> dict[str, str]:
    document = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return {
        rule["alert"]: rule["expr"]
        for group in document["groups"]
        for rule in group["rules"]
        if rule.get("alert") in ("PipelineMessageWaitingTooLong", "PipelineMessageWaitingLong")
    }


async def test_a_long_run_is_not_paged_as_a_message_waiting(
    transport: Transport, unique: str
) -> None:
    """A 10-minute run with nothing waiting reads as a 10-minute wait, so the lane is marked."""
    spec = TopicSpec.model_validate(
        {"name": f"longage_{unique}", "partitions": 1, "heartbeat_timeout": "5m"}
    )
    await declare(transport, spec)
    app, started, release = held_app(spec)
    await produce(transport, spec.name, [Record(b"long", b"k")])
    metrics = Metrics()
    settings = FAST.model_copy(update={"pressure": PressureSettings(enabled=False)})
    member = Member(app, transport, f"g-{unique}", settings, metrics=RuntimeMetrics(metrics))
    value = metrics.registry.get_sample_value
    (watch,) = lane_watches([spec], only_groups=[f"g-{unique}"])
    try:
        async with running(member):
            await started.wait()
            # Ten minutes into the run: the probe sees its one message as 10 minutes old.
            report = await probe_lane(
                transport.admin(), watch, {spec.dead_letter: 0}, clock=lambda: time.time() + 601
            )
            await eventually(lambda: value(GAUGE, {"lane": spec.lane}) is not None, 15.0)
            assert value(GAUGE, {"lane": spec.lane}) == 300
            release.set()
    finally:
        release.set()
    assert report.lag == 1  # the running message, and nothing waiting behind it
    assert report.oldest_age_s > 600  # what PipelineMessageWaitingTooLong compares with 600
    alerts = _age_alerts()
    assert len(alerts) == 2
    for name, expr in alerts.items():
        assert f"unless on (lane) max by (lane) ({GAUGE})" in expr, name


async def test_messages_finished_behind_a_long_run_are_counted_for_their_group(
    transport: Transport, unique: str
) -> None:
    """The gauge PipelineLagGrowing subtracts from a group's lag carries that group's name."""
    spec = TopicSpec.model_validate(
        {"name": f"longgrp_{unique}", "partitions": 1, "heartbeat_timeout": "5m", "ordered": False}
    )
    await declare(transport, spec)
    app = App([spec])
    release = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"long":
            await release.wait()

    records = [Record(b"long", b"k0")] + [Record(b"short", f"k{i}".encode()) for i in range(1, 6)]
    await produce(transport, spec.name, records)
    metrics = Metrics()
    settings = FAST.model_copy(
        update={"max_concurrency": 4, "pressure": PressureSettings(enabled=False)}
    )
    member = Member(app, transport, f"g-{unique}", settings, metrics=RuntimeMetrics(metrics))
    finished = {"lane": spec.lane, "group": f"g-{unique}"}
    value = metrics.registry.get_sample_value
    try:
        async with running(member):
            await eventually(lambda: member.stats.handled == 5)
            await eventually(
                lambda: value("pipeline_finished_uncommitted_messages", finished) == 5, 15.0
            )
            release.set()
    finally:
        release.set()
