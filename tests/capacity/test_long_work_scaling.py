"""A lane of long work scales on what waits, not on how long its running messages have run."""

from __future__ import annotations

from pipeline.config import RuntimeSettings
from pipeline.topics.spec import TopicSpec
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
