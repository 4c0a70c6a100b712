"""The lane plan from real Redis history, its /metrics gauges and the `pipeline capacity` CLI."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from typer.testing import CliRunner

from pipeline.capacity.history import MINUTES_PER_DAY, ArrivalHistory
from pipeline.capacity.plan import plan_lane
from pipeline.capacity.recorder import ArrivalRecorder
from pipeline.capacity.settings import CapacitySettings
from pipeline.capacity.source import CapacitySource, ServiceTimeSource
from pipeline.cli import app
from pipeline.observability.facades import CapacityMetrics, DebounceMetrics, RuntimeMetrics
from pipeline.observability.metrics import Metrics

NOW_S = 20_000 * 86_400 + 14 * 3600.0  # a weekday, 14:00 UTC
NOW_MIN = int(NOW_S // 60)


def per_minute(minute: int) -> int:
    """A clean daily shape: 60 arrivals a minute at night, 600 at 14:00."""
    hour = (minute % MINUTES_PER_DAY) / 60
    return round(60 + 540 * math.exp(-(((hour - 14) / 3) ** 2)))


@pytest.fixture
async def history(redis: Redis, unique: str) -> AsyncIterator[ArrivalHistory]:
    """Eight days of the daily shape for lane ``messages`` under a prefix of this test."""
    prefix = f"t{unique}"
    store = ArrivalHistory(redis, prefix)
    start = NOW_MIN - 8 * MINUTES_PER_DAY
    for number, first in enumerate(range(start, NOW_MIN, 720)):
        counts = {("messages", m): per_minute(m) for m in range(first, first + 720)}
        await store.add_once("test", [(number, counts)], settled={})
    await store.add_service({("messages", NOW_MIN - 1): (100, 25.0)})  # 0.25 s each
    yield store
    found = [key async for key in redis.scan_iter(match=f"{{{prefix}:cap:*")]
    await redis.delete(*found)


async def test_the_plan_forecasts_the_daily_shape_and_sizes_by_littles_law(
    history: ArrivalHistory,
) -> None:
    """The forecast peak is within 10 % of the curve; members follow lambda x s / (slots x 0.7)."""
    settings = CapacitySettings(lead_s=600)
    plan = await plan_lane(history, "messages", settings, slots_per_member=4, now_s=NOW_S)
    truth = max(per_minute(m) for m in range(NOW_MIN, NOW_MIN + 10)) / 60
    assert plan.season == "week"
    assert plan.forecast.peak_per_s == pytest.approx(truth, rel=0.10)
    assert (plan.service_s, plan.service_source) == (0.25, "measured")
    assert plan.desired_members == math.ceil(plan.forecast.peak_per_s * 0.25 / (4 * 0.7))
    assert plan.expected_wait_s < math.inf


async def test_the_source_exports_forecast_and_desired_members(history: ArrivalHistory) -> None:
    """A refresh sets the gauges of every lane, a lane without history at its floor."""
    metrics = Metrics()
    source = CapacitySource(
        history,
        ["messages", "quiet"],
        CapacitySettings(min_members=2),
        CapacityMetrics(metrics),
        slots_per_member=4,
        clock=lambda: NOW_S,
    )
    await source.refresh()
    (busy, quiet) = source.plans
    registry = metrics.registry
    forecast = registry.get_sample_value(
        "pipeline_forecast_arrivals_per_second", {"lane": "messages"}
    )
    assert forecast == pytest.approx(busy.planned_per_s)
    assert registry.get_sample_value("pipeline_desired_members", {"lane": "messages"}) == (
        busy.desired_members
    )
    assert registry.get_sample_value("pipeline_desired_members", {"lane": "quiet"}) == 2
    service = registry.get_sample_value("pipeline_service_time_seconds", {"lane": "messages"})
    assert service == busy.service_s == 0.25
    assert quiet.season == "none"


def test_the_cli_prints_rate_service_slots_utilisation_wait_and_members(
    redis_service: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pipeline capacity LANE --json` reports every figure the planner computes."""
    monkeypatch.setenv("PIPELINE_REDIS__URL", redis_service)
    monkeypatch.setenv("PIPELINE_REDIS__KEY_PREFIX", f"t{unique}")
    monkeypatch.setenv("PIPELINE_CAPACITY__SERVICE_S", '{"messages": 0.5}')
    result = CliRunner().invoke(app, ["capacity", "messages", "--members", "3", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["service_s"] == 0.5
    assert shown["service_source"] == "configured"
    assert (shown["members"], shown["slots"]) == (3, 3 * 64)
    assert shown["utilisation"] == 0.0
    assert shown["expected_wait_s"] == 0.0
    text = CliRunner().invoke(app, ["capacity", "messages"]).output
    assert "expected wait" in text
    assert "members needed" in text


def test_an_idle_lane_that_may_scale_to_zero_prints_valid_figures(
    redis_service: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No arrivals and MIN_MEMBERS=0: zero members at 0 % busy, strict JSON, no 'inf%'."""
    monkeypatch.setenv("PIPELINE_REDIS__URL", redis_service)
    monkeypatch.setenv("PIPELINE_REDIS__KEY_PREFIX", f"t{unique}")
    monkeypatch.setenv("PIPELINE_CAPACITY__MIN_MEMBERS", "0")
    result = CliRunner().invoke(app, ["capacity", "messages", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output, parse_constant=lambda name: pytest.fail(f"not JSON: {name}"))
    assert (shown["members"], shown["slots"], shown["utilisation"]) == (0, 0, 0.0)
    assert (shown["desired_members"], shown["members_for_target_wait"]) == (0, 0)
    text = CliRunner().invoke(app, ["capacity", "messages"]).output
    assert "inf" not in text
    assert "utilisation     0.0%" in text


def test_the_cli_names_an_unknown_lane_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown lane exits 2 with the lanes that exist, no traceback."""
    monkeypatch.setenv("PIPELINE_REDIS__URL", "redis://127.0.0.1:1/0")
    result = CliRunner().invoke(app, ["capacity", "nope"])
    assert result.exit_code == 2
    assert "unknown lane 'nope'" in result.output
    assert "Traceback" not in result.output


def test_the_cli_refuses_a_service_time_for_a_lane_no_topic_declares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A misspelt lane in SERVICE_S is one line naming it and the variable, not a default plan."""
    monkeypatch.setenv("PIPELINE_REDIS__URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("PIPELINE_CAPACITY__SERVICE_S", '{"mesages": 4.0}')
    result = CliRunner().invoke(app, ["capacity", "messages"])
    assert result.exit_code == 2, result.output
    assert "PIPELINE_CAPACITY__SERVICE_S" in result.output
    assert "'mesages'" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_the_cli_says_where_redis_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis unreachable: exit 1 with the URL and how to start it."""
    monkeypatch.setenv("PIPELINE_REDIS__URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("PIPELINE_REDIS__SOCKET_TIMEOUT_S", "0.5")
    result = CliRunner().invoke(app, ["capacity", "messages"])
    assert result.exit_code == 1
    assert "cannot reach Redis at redis://127.0.0.1:1/0 (PIPELINE_REDIS__URL)" in result.output
    assert "start it (`make services`)" in result.output


async def test_a_members_handled_durations_become_the_measured_service_time(
    redis: Redis, unique: str
) -> None:
    """What a member's handler histogram gains between refreshes is recorded per lane."""
    prefix = f"t{unique}"
    history = ArrivalHistory(redis, prefix)
    metrics = Metrics()
    runtime = RuntimeMetrics(metrics)
    source = ServiceTimeSource(metrics, ArrivalRecorder(history), ["messages", "idle"])
    try:
        runtime.delivered("messages", "handled", 3.0)
        runtime.delivered("messages", "retried", 100.0)  # not a service time of the lane
        await source.refresh()
        runtime.delivered("messages", "handled", 1.0)
        runtime.delivered("messages", "handled", 2.0)
        await source.refresh()
        sample = await history.service("messages", int(time.time() // 60) + 1)
        assert (sample.count, sample.total_s) == (3, 6.0)
        assert (await history.service("idle", int(time.time() // 60) + 1)).count == 0
    finally:
        found = [key async for key in redis.scan_iter(match=f"{{{prefix}:cap:*")]
        if found:
            await redis.delete(*found)


async def test_a_debounced_lanes_service_time_is_per_message_not_per_turn(
    redis: Redis, unique: str
) -> None:
    """Two turns of 4 messages taking 2 s each record 8 messages for 4 s: 0.5 s a message."""
    prefix = f"t{unique}"
    history = ArrivalHistory(redis, prefix)
    metrics = Metrics()
    runtime, debounce = RuntimeMetrics(metrics), DebounceMetrics(metrics)
    source = ServiceTimeSource(metrics, ArrivalRecorder(history), ["ai_turns"])
    try:
        for _ in range(2):
            debounce.turn("ai_turns", 4, 0.0)
            runtime.delivered("ai_turns", "handled", 2.0)
        await source.refresh()
        sample = await history.service("ai_turns", int(time.time() // 60) + 1)
        assert (sample.count, sample.total_s) == (8, 4.0)
    finally:
        found = [key async for key in redis.scan_iter(match=f"{{{prefix}:cap:*")]
        if found:
            await redis.delete(*found)


async def test_a_turn_handled_after_the_refresh_it_started_in_is_still_per_message(
    redis: Redis, unique: str
) -> None:
    """A turn of 4 that started before a refresh and ended after it records 4 messages, not 1."""
    prefix = f"t{unique}"
    history = ArrivalHistory(redis, prefix)
    metrics = Metrics()
    runtime, debounce = RuntimeMetrics(metrics), DebounceMetrics(metrics)
    source = ServiceTimeSource(metrics, ArrivalRecorder(history), ["ai_turns"])
    try:
        debounce.turn("ai_turns", 4, 0.0)
        runtime.delivered("ai_turns", "handled", 2.0)
        await source.refresh()
        debounce.turn("ai_turns", 4, 0.0)  # a long turn: started here ...
        await source.refresh()
        runtime.delivered("ai_turns", "handled", 8.0)  # ... handled after the next refresh
        await source.refresh()
        sample = await history.service("ai_turns", int(time.time() // 60) + 1)
        assert (sample.count, sample.total_s) == (8, 10.0)
    finally:
        found = [key async for key in redis.scan_iter(match=f"{{{prefix}:cap:*")]
        if found:
            await redis.delete(*found)


def test_the_runbooks_service_time_query_reads_what_a_member_measures() -> None:
    """docs/operations.md sizes a lane from handled messages only, as ServiceTimeSource does.

    Over every outcome the mean mixes in retried runs (often timeouts) and a debounced lane's
    buffering, and sizes the lane for neither.
    """
    runbook = (Path(__file__).parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    selectors = re.findall(r"pipeline_handler_duration_seconds_(?:sum|count)(\{[^}]*\})?", runbook)
    assert len(selectors) >= 2
    assert all('outcome="handled"' in selector for selector in selectors), selectors
