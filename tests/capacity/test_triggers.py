"""The consumer groups' KEDA ScaledObjects scale on the forecast's desired member count."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from pipeline.config import RuntimeSettings
from pipeline.observability.metrics import DESIRED_MEMBERS, family
from pipeline.topics.spec import TopicSpec
from scripts.manifests import lane_manifests

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
