"""The consumer groups' KEDA ScaledObjects scale on the forecast's members and on the backlog."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from pipeline.capacity.triggers import slot_query
from pipeline.config import RuntimeSettings
from pipeline.observability.metrics import DESIRED_MEMBERS, family
from pipeline.topics.spec import TopicSpec
from scripts.manifests import lane_manifests, pods_of

CONSUMERS = Path(__file__).parents[2] / "deploy" / "k8s" / "base" / "consumers"


def forecast_triggers(scaled: dict[str, object]) -> list[dict[str, dict[str, str]]]:
    """The triggers of a ScaledObject that read pipeline_desired_members."""
    triggers = scaled["spec"]["triggers"]  # type: ignore[index]
    return [t for t in triggers if DESIRED_MEMBERS.name in t["metadata"]["query"]]


def test_every_committed_interactive_lane_scales_on_its_desired_members() -> None:
    """Each generated ScaledObject reads its own lane's desired members as a count (threshold 1)."""
    files = sorted(p for p in CONSUMERS.glob("*.yaml") if p.name != "kustomization.yaml")
    assert files
    for path in files:
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
        lane = scaled["metadata"]["labels"]["pipeline.dev/lane"]
        (trigger,) = forecast_triggers(scaled)
        assert trigger["type"] == "prometheus"
        assert trigger["metadata"]["query"] == f'max(pipeline_desired_members{{lane="{lane}"}})'
        assert trigger["metadata"]["threshold"] == "1"
        names = set(re.findall(r"(pipeline_[a-z_]+)\{", trigger["metadata"]["query"]))
        assert all(family(name).labels == ("lane",) for name in names)
        queries = " ".join(t["metadata"]["query"] for t in scaled["spec"]["triggers"])
        assert "pipeline_worker_slots_busy" in queries  # beside slot utilisation, not instead


def test_a_batch_lane_never_asks_for_members_from_the_forecast() -> None:
    """Batch work runs on idle capacity only, so its ScaledObject has no forecast trigger."""
    batch = TopicSpec.model_validate(
        {"name": "reindex", "partitions": 4, "batch": {"sla": "12h", "promote_at": 0.75}}
    )
    *_, scaled = lane_manifests(batch.lane, [batch], RuntimeSettings())
    assert forecast_triggers(scaled) == []


def slot_trigger(scaled: dict[str, object]) -> dict[str, dict[str, str]]:
    """The trigger of a ScaledObject that reads the members' busy slots."""
    triggers = scaled["spec"]["triggers"]  # type: ignore[index]
    (trigger,) = [t for t in triggers if "pipeline_worker_slots_busy" in t["metadata"]["query"]]
    return trigger  # type: ignore[no-any-return]


def test_an_interactive_lanes_slot_trigger_adds_the_members_its_backlog_needs() -> None:
    """Busy slots plus, per threshold, the members to drain what waits beyond one member."""
    spec = TopicSpec.model_validate({"name": "messages", "partitions": 8})
    runtime = RuntimeSettings(max_concurrency=16)
    *_, scaled = lane_manifests(spec.lane, [spec], runtime)
    trigger = slot_trigger(scaled)
    threshold = int(trigger["metadata"]["threshold"])
    assert threshold == 11  # 70 % of 16 slots
    query = trigger["metadata"]["query"]
    pods = pods_of(scaled["metadata"]["name"])  # type: ignore[index]
    assert query == slot_query(spec.lane, spec.lane, pods, slots_per_member=16, threshold=threshold)
    assert query.startswith(f'sum(pipeline_worker_slots_busy{{pod=~"{pods}"}}) + 11 * (ceil(')
    assert f'max(pipeline_consumer_lag_messages{{lane="{spec.lane}",group="{spec.lane}"}})' in query
    assert f'(sum(pipeline_throttle_waiting{{lane="{spec.lane}"}}) or vector(0)) - (' in query
    finished = f'sum(pipeline_finished_uncommitted_messages{{lane="{spec.lane}",pod=~"{pods}"}})'
    assert f"({finished} or vector(0)) - 16, 0)" in query
    assert f'max(pipeline_service_time_seconds{{lane="{spec.lane}"}}) / 4800)' in query
    assert query.endswith(" or vector(0))")  # no planner yet: the plain busy-slot trigger
    for name, labels in re.findall(r"(pipeline_[a-z_]+)\{([^}]*)\}", query):
        declared = set(family(name).labels)
        assert {part.split("=")[0] for part in labels.split(",")} <= declared | {"pod"}


def test_a_batch_lanes_slot_trigger_counts_busy_slots_only() -> None:
    """A batch lane's backlog is its design, so its slot trigger asks for no backlog members."""
    batch = TopicSpec.model_validate(
        {"name": "reindex", "partitions": 4, "batch": {"sla": "12h", "promote_at": 0.75}}
    )
    *_, scaled = lane_manifests(batch.lane, [batch], RuntimeSettings())
    query = slot_trigger(scaled)["metadata"]["query"]
    assert "pipeline_consumer_lag_messages" not in query


def test_every_committed_interactive_lane_sizes_its_backlog_in_the_slot_trigger() -> None:
    """Each generated interactive ScaledObject's slot trigger reads the lag and service time."""
    for path in sorted(p for p in CONSUMERS.glob("*.yaml") if p.name != "kustomization.yaml"):
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
        if not forecast_triggers(scaled):
            continue  # a batch lane
        query = slot_trigger(scaled)["metadata"]["query"]
        assert "pipeline_consumer_lag_messages" in query
        assert "pipeline_service_time_seconds" in query


def test_a_lanes_pod_regex_takes_its_own_pods_only() -> None:
    """Deployment and StatefulSet pods of the lane; not those of a lane whose name extends it."""
    pods = pods_of("consumer-ai")
    assert re.fullmatch(pods, "consumer-ai-7d9f8c6b5d-x2k9q")  # a Deployment's pod
    assert re.fullmatch(pods, "consumer-ai-3")  # a StatefulSet's
    assert not re.fullmatch(pods, "consumer-ai-turns-7d9f8c6b5d-x2k9q")
    assert not re.fullmatch(pods, "consumer-ai-turns-0")
