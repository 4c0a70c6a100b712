"""The PromQL of deploy/ checked by Prometheus's own engine: promtool (``make promtool``).

``promtool check rules`` parses deploy/prometheus/alerts.yaml and every query of the KEDA
ScaledObjects of deploy/k8s; ``promtool test rules`` runs the rule unit tests of
tests/deploy/promtool/, whose series carry the names and labels a scraped member exports. The
unit tests run on a copy of the rules without their annotations (promtool compares rendered
annotations whole; ``check rules`` already parses their templates). promtool is built once from
its Go module and cached (deploy/local/promtool.sh); without it these tests skip.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import promtool_binary

from pipeline.config import RuntimeSettings
from pipeline.topics.spec import TopicSpec
from scripts.manifests import lane_manifests

ROOT = Path(__file__).parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
K8S = ROOT / "deploy" / "k8s"
RULE_TESTS = Path(__file__).parent / "promtool"


@pytest.fixture(scope="module")
def promtool() -> Path:
    """The cached promtool binary; skip when it has not been built."""
    return promtool_binary()


def run(promtool: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool with ARGS, its output kept."""
    return subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def keda_queries() -> list[tuple[str, str]]:
    """(where, query) of every Prometheus trigger of every ScaledObject under deploy/k8s."""
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(document, dict) or document.get("kind") != "ScaledObject":
                continue
            for index, trigger in enumerate(document["spec"]["triggers"]):
                if trigger["type"] == "prometheus":
                    where = f"{path.relative_to(ROOT)}#{index}"
                    found.append((where, trigger["metadata"]["query"]))
    return found


def test_the_alert_rules_pass_promtool_check(promtool: Path) -> None:
    """Every rule of alerts.yaml parses in promtool: its expression and its templates."""
    result = run(promtool, "check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr


def generated_queries() -> list[tuple[str, str]]:
    """The queries scripts/manifests.py writes for a batch lane and a lane of long work."""
    runtime = RuntimeSettings()
    found = []
    for declared in (
        {"name": "reindex", "partitions": 4, "batch": {"sla": "12h", "promote_at": 0.75}},
        {"name": "vision", "partitions": 12, "heartbeat_timeout": "5m"},
    ):
        spec = TopicSpec.model_validate(declared)
        *_, scaled = lane_manifests(spec.lane, [spec], runtime)
        for index, trigger in enumerate(scaled["spec"]["triggers"]):
            found.append((f"{spec.lane}#{index}", trigger["metadata"]["query"]))
    return found


def test_every_keda_query_parses(promtool: Path, tmp_path: Path) -> None:
    """Each ScaledObject's Prometheus query is valid PromQL (checked as a recording rule).

    Those of deploy/k8s, and those the generator writes for the lane kinds it has none of.
    """
    queries = keda_queries() + generated_queries()
    assert len(queries) >= 10, queries
    rules = [{"record": f"keda:query{n}", "expr": query} for n, (_, query) in enumerate(queries)]
    path = tmp_path / "keda.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "keda", "rules": rules}]}))
    result = run(promtool, "check", "rules", str(path))
    names = "\n".join(f"keda:query{n} is {where}" for n, (where, _) in enumerate(queries))
    assert result.returncode == 0, result.stdout + result.stderr + names


def bare_rules() -> dict[str, Any]:
    """alerts.yaml without its annotations."""
    document: dict[str, Any] = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return document


@pytest.mark.parametrize("name", sorted(p.stem for p in RULE_TESTS.glob("*.yaml")))
def test_alert_rule_unit_tests(promtool: Path, tmp_path: Path, name: str) -> None:
    """The alerts fire, and stay quiet, on realistic series as tests/deploy/promtool/NAME says."""
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(bare_rules()), encoding="utf-8")
    shutil.copy(RULE_TESTS / f"{name}.yaml", tmp_path / "test.yaml")
    result = run(promtool, "test", "rules", "test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


MEMBER = 'job="kubernetes-pods",instance="10.42.0.{n}:9100",pod="consumer-messages-7d9f8c6b5-{pod}"'
OTHER_LANE = (
    'job="kubernetes-pods",instance="10.42.0.40:9100",pod="consumer-messages-eu-7d9f8-ab3d9"'
)
INGRESS = 'job="kubernetes-pods",instance="10.42.0.9:9100",pod="ingress-6f7c9d8b4-q8w2n"'


@pytest.mark.parametrize(("service_s", "slot_value"), [(0.6, 172.0), (None, 128.0)])
def test_the_keda_queries_of_a_lane_read_its_members(
    promtool: Path, tmp_path: Path, service_s: float | None, slot_value: float
) -> None:
    """On the series its members and the ingress export, each messages trigger asks for its count.

    Two members with all 64 slots busy and 1000 messages of lag: 808 wait beyond one member's
    slots, which at 0.6 s each drain in 300 s with one more member (threshold 44); with no
    planner's service time the slot trigger is the busy slots alone. A pod of another lane whose
    name extends this one's is not counted.
    """
    (scaled,) = [
        document
        for document in yaml.safe_load_all((K8S / "base/consumers/messages.yaml").read_text())
        if document["kind"] == "ScaledObject"
    ]
    age, slots, desired = (t["metadata"]["query"] for t in scaled["spec"]["triggers"])
    first, second = MEMBER.format(n=17, pod="x2k4q"), MEMBER.format(n=18, pod="m9z7p")
    group = 'group="messages",lane="messages"'
    series = [
        (f"pipeline_worker_slots_busy{{{first}}}", "64"),
        (f"pipeline_worker_slots_busy{{{second}}}", "64"),
        (f"pipeline_worker_slots_busy{{{OTHER_LANE}}}", "50"),
        (f'pipeline_throttle_waiting{{lane="messages",{first}}}', "0"),
        (f'pipeline_finished_uncommitted_messages{{lane="messages",{second}}}', "0"),
        (f"pipeline_consumer_lag_messages{{{group},{first}}}", "1000"),
        (f"pipeline_consumer_lag_messages{{{group},{INGRESS}}}", "1000"),
        (f"pipeline_oldest_message_age_seconds{{{group},{first}}}", "45"),
        (f"pipeline_oldest_message_age_seconds{{{group},{INGRESS}}}", "46"),
        (f'pipeline_desired_members{{lane="messages",{INGRESS}}}', "3"),
    ]
    if service_s is not None:
        series.append(
            (f'pipeline_service_time_seconds{{lane="messages",{INGRESS}}}', f"{service_s}")
        )
    expected = [(age, 46.0), (slots, slot_value), (desired, 3.0)]
    document = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": f"{v}x5"} for s, v in series],
                "promql_expr_test": [
                    {"expr": q, "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": v}]}
                    for q, v in expected
                ],
            }
        ],
    }
    (tmp_path / "keda_test.yaml").write_text(yaml.safe_dump(document), encoding="utf-8")
    result = run(promtool, "test", "rules", "keda_test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
