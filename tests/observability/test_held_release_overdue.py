"""Held followers whose release no member runs: their age is exported and pages.

On an ordered lane with retry tiers, the followers held behind a parked key have their offsets
committed: Redis holds their only copy. Once the head's copy succeeded they are released to its
member under a lease (``T:rel``, renewed every commit tick); a member that dies mid-release
leaves the lease to run out and another member's reaper takes the release over. With no member
reaping the lane (all dead in a quiet hour, or none running it), nothing else waits: the main
topic and the retry tiers are committed, so no lag, age or retry overdue sees the followers.
These tests park a key with the real guard functions on the test Redis, kill its release's
member, and read ``/metrics`` as a member's telemetry renders it, with the alert rules run on
those scrapes by promtool.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from retry.test_marks_outage import guard, ordered_lane, pass_time, start_of
from retry.test_release_outage import parked_with, ran_on_reap
from support import promtool_binary, test_settings

from pipeline.observability.metrics import Metrics
from pipeline.observability.server import MetricsServer
from pipeline.observability.wiring import held_release_sources, member_telemetry
from pipeline.retry.guard_store import GuardStore, KeyEnds
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport

pytestmark = pytest.mark.redis
OVERDUE = "pipeline_held_release_overdue_seconds"
ROOT = Path(__file__).parents[2]
MINUTE_MS = 60_000


async def released_then_orphaned(redis: Redis, unique: str) -> tuple[TopicSpec, GuardStore, str]:
    """Key ``k`` parked with two followers; its head ran, their release went to a member that died.

    Returns the lane, the guard store and the prefix its keys are under.
    """
    spec = ordered_lane(unique)
    store = guard(redis, unique, spec)
    copy = await parked_with(store, spec.name, 2)
    assert await start_of(store, copy) == "head"
    [released] = await store.end_many([KeyEnds([(copy, "done")], follow_dead=False)])
    assert len(released) == 2
    return spec, store, f"t{unique}"


def overdue_in(snapshot: bytes, lane: str) -> float | None:
    """The gauge's value for ``lane`` in a ``/metrics`` exposition (None: no such sample)."""
    for family in text_string_to_metric_families(snapshot.decode()):
        for sample in family.samples:
            if sample.name == OVERDUE and sample.labels.get("lane") == lane:
                return float(sample.value)
    return None


async def test_a_release_whose_member_died_ages_in_metrics_until_it_is_taken_over(
    redis: Redis, unique: str
) -> None:
    """0 while the lease holds; the time past it once it ran out, growing; 0 once reaped."""
    spec, store, prefix = await released_then_orphaned(redis, unique)
    metrics = Metrics()
    server = MetricsServer(metrics, held_release_sources(metrics, redis, prefix, [spec]))
    assert await server.refresh_once()
    assert overdue_in(server.snapshot, spec.lane) == 0  # its member is alive and renews it

    await pass_time(redis, store, store.lease_ms + 700_000)  # it died, no member reaps
    assert await server.refresh_once()
    first = overdue_in(server.snapshot, spec.lane)
    assert first is not None
    assert first == pytest.approx(700.0, abs=5.0)
    await pass_time(redis, store, MINUTE_MS)  # nothing new arrives: it still ages
    assert await server.refresh_once()
    assert overdue_in(server.snapshot, spec.lane) == pytest.approx(first + 60.0, abs=5.0)

    back = guard(redis, unique, spec)  # a member comes back and takes the release over
    assert len(await ran_on_reap(back)) == 2
    assert await back.parked_count() == 0
    assert await server.refresh_once()
    assert overdue_in(server.snapshot, spec.lane) == 0


async def test_a_member_given_its_redis_reports_its_ordered_lanes_releases(
    redis: Redis, unique: str
) -> None:
    """A member's telemetry (as ``pipeline consume`` wires it) reads its lanes' releases."""
    spec, store, prefix = await released_then_orphaned(redis, unique)
    await pass_time(redis, store, store.lease_ms + 700_000)
    transport = create_transport(test_settings(transport="redis"))
    try:
        telemetry = member_telemetry(
            transport.admin(), [spec], spec.lane, redis=redis, redis_prefix=prefix
        )
        (source,) = [s for s in telemetry.server.sources if s.name == "held_release_overdue"]
        await source.refresh()
        value = telemetry.metrics.registry.get_sample_value(OVERDUE, {"lane": spec.lane})
        assert value == pytest.approx(700.0, abs=5.0)
    finally:
        await transport.close()


def test_lanes_that_never_hold_followers_get_no_source(redis: Redis) -> None:
    """Unordered lanes, and ordered lanes without retry tiers, hold nothing: no Redis read."""
    plain = TopicSpec.model_validate({"name": "events", "partitions": 1, "ordered": False})
    untiered = TopicSpec.model_validate({"name": "messages", "partitions": 1})
    assert held_release_sources(Metrics(), redis, "p", [plain, untiered]) == []


async def test_the_alert_pages_on_the_scraped_series_and_resolves_once_reaped(
    redis: Redis, unique: str, tmp_path: Path
) -> None:
    """PipelineHeldFollowersOverdue on one scrape a minute: pending past 10 min, a page 2 min on.

    The series is what a member's ``/metrics`` showed at each minute, the release's member dead
    from 9 minutes before the first; the last scrapes follow the reaper's takeover.
    """
    promtool = promtool_binary()
    spec, store, prefix = await released_then_orphaned(redis, unique)
    metrics = Metrics()
    server = MetricsServer(metrics, held_release_sources(metrics, redis, prefix, [spec]))
    await pass_time(redis, store, store.lease_ms + 9 * MINUTE_MS)
    scraped: list[float] = []
    for _ in range(7):  # minutes 0..6: 9 to 15 minutes past the lease
        assert await server.refresh_once()
        value = overdue_in(server.snapshot, spec.lane)
        assert value is not None
        scraped.append(round(value))
        await pass_time(redis, store, MINUTE_MS)
    assert len(await ran_on_reap(guard(redis, unique, spec))) == 2
    for _ in range(3):  # minutes 7..9: taken over
        assert await server.refresh_once()
        value = overdue_in(server.snapshot, spec.lane)
        assert value is not None
        scraped.append(round(value))
    assert scraped[-3:] == [0, 0, 0]
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yaml").read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rules), encoding="utf-8")
    labels = f'lane="{spec.lane}",job="kubernetes-pods",instance="10.42.0.17:9100"'
    firing = [{"exp_labels": {"severity": "page", "lane": spec.lane}}]
    case = {
        "interval": "1m",
        "input_series": [
            {"series": f"{OVERDUE}{{{labels}}}", "values": " ".join(map(str, scraped))}
        ],
        "alert_rule_test": [
            {"eval_time": "2m", "alertname": "PipelineHeldFollowersOverdue", "exp_alerts": []},
            {"eval_time": "3m", "alertname": "PipelineHeldFollowersOverdue", "exp_alerts": []},
            {"eval_time": "4m", "alertname": "PipelineHeldFollowersOverdue", "exp_alerts": firing},
            {"eval_time": "6m", "alertname": "PipelineHeldFollowersOverdue", "exp_alerts": firing},
            {"eval_time": "8m", "alertname": "PipelineHeldFollowersOverdue", "exp_alerts": []},
        ],
    }
    test = {"rule_files": ["alerts.yaml"], "evaluation_interval": "1m", "tests": [case]}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test), encoding="utf-8")
    result = await asyncio.to_thread(
        subprocess.run,
        [str(promtool), "test", "rules", "test.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, f"scraped {scraped}\n{result.stdout}{result.stderr}"
