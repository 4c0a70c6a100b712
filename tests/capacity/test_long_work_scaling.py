"""A lane of long work scales on what waits, not on how long its running messages have run."""

from __future__ import annotations

import asyncio
import math
import re

from runtime.helpers import FAST, declare, eventually, produce, running

from pipeline.config import PressureSettings, RuntimeSettings
from pipeline.envelope import Record
from pipeline.observability.facades import RuntimeMetrics
from pipeline.observability.metrics import Metrics
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport
from scripts.manifests import lane_manifests


def _queries(spec: TopicSpec) -> list[str]:
    *_, scaled = lane_manifests(spec.lane, [spec], RuntimeSettings())
    return [t["metadata"]["query"] for t in scaled["spec"]["triggers"]]


def test_a_long_work_lane_has_no_age_trigger() -> None:
    """A running 10-minute message is its group's oldest uncommitted one, so age would scale out."""
    long_work = TopicSpec.model_validate(
        {"name": "vision", "partitions": 12, "heartbeat_timeout": "5m"}
    )
    queries = _queries(long_work)
    assert not [q for q in queries if "pipeline_oldest_message_age_seconds" in q]
    # What waits still scales it: busy slots plus the backlog term, and the forecast.
    assert any("pipeline_consumer_lag_messages" in q for q in queries)
    assert any("pipeline_desired_members" in q for q in queries)


def test_an_interactive_lane_keeps_its_age_trigger() -> None:
    """Short handlers' oldest message has mostly waited: its age stays a scaling signal."""
    queries = _queries(TopicSpec.model_validate({"name": "replies", "partitions": 4}))
    assert any("pipeline_oldest_message_age_seconds" in q for q in queries)


def test_a_long_work_lane_keeps_every_member_that_runs_long_work() -> None:
    """Busy slots ask for ceil(runs / 44) members, so scale-in would stop members' long runs."""
    long_work = TopicSpec.model_validate(
        {"name": "vision", "partitions": 12, "heartbeat_timeout": "5m"}
    )
    *_, scaled = lane_manifests(long_work.lane, [long_work], RuntimeSettings())
    (protecting,) = [
        t["metadata"]
        for t in scaled["spec"]["triggers"]
        if "pipeline_long_work_running" in t["metadata"]["query"]
    ]
    assert protecting["query"].startswith("count(pipeline_long_work_running{pod=~")
    assert "> 0" in protecting["query"]
    assert protecting["threshold"] == "1"
    interactive = TopicSpec.model_validate({"name": "replies", "partitions": 4})
    assert not [q for q in _queries(interactive) if "pipeline_long_work_running" in q]


def _evaluate(query: str, values: dict[str, float]) -> float:
    """``query`` with each ``agg(family{...})`` read as ``values[family]`` (0 when absent).

    Enough PromQL for the slot trigger: sums, maxima, ``clamp_min``, ``ceil`` and ``or
    vector(0)`` on single numbers.
    """
    numbers = re.sub(
        r'(?:sum|max|count)\((pipeline_[a-z_]+)\{(?:[^"}]|"[^"]*")*\}\)',
        lambda m: repr(float(values.get(m.group(1), 0.0))),
        query,
    )
    python = numbers.replace(" or vector(0)", "").replace("clamp_min(", "max(")
    return float(eval(python, {"ceil": math.ceil, "max": max}))  # noqa: S307 - numbers only


async def test_messages_finished_behind_a_long_run_ask_for_no_members(
    transport: Transport, unique: str
) -> None:
    """Finished messages behind a running one stay in the lag, so the member says how many."""
    spec = TopicSpec.model_validate(
        {"name": f"longlag_{unique}", "partitions": 1, "heartbeat_timeout": "5m", "ordered": False}
    )
    await declare(transport, spec)
    app = App([spec])
    release = asyncio.Event()

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"long":
            await release.wait()

    await produce(
        transport,
        spec.name,
        [Record(b"long", b"k0")] + [Record(b"short", f"k{i}".encode()) for i in range(1, 51)],
    )
    metrics = Metrics()
    settings = FAST.model_copy(
        update={"max_concurrency": 4, "pressure": PressureSettings(enabled=False)}
    )
    member = Member(app, transport, f"g-{unique}", settings, metrics=RuntimeMetrics(metrics))
    value = metrics.registry.get_sample_value
    shown = {"lane": spec.lane, "group": f"g-{unique}"}
    try:
        async with running(member):
            await eventually(lambda: member.stats.handled == 50)
            await eventually(
                lambda: value("pipeline_finished_uncommitted_messages", shown) == 50, 15.0
            )
            lag = sum(p.lag for p in await transport.admin().group_lag(f"g-{unique}", spec.name))
            busy = value("pipeline_worker_slots_busy", {})
            release.set()
    finally:
        release.set()
    assert (lag, busy) == (51, 1)  # the running message and the 50 finished behind it
    *_, scaled = lane_manifests(spec.lane, [spec], settings)
    (slots,) = [
        t["metadata"]
        for t in scaled["spec"]["triggers"]
        if "pipeline_worker_slots_busy" in t["metadata"]["query"]
    ]
    asked = _evaluate(
        slots["query"],
        {
            "pipeline_worker_slots_busy": busy,
            "pipeline_consumer_lag_messages": lag,
            "pipeline_service_time_seconds": 40.0,  # the lane's mean run, as the planner says
            "pipeline_finished_uncommitted_messages": 50,
        },
    )
    # KEDA asks for ceil(value / threshold) members: one, for the one run in progress.
    assert math.ceil(asked / float(slots["threshold"])) == 1
