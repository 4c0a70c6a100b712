"""A debounced lane's ScaledObject sees turns that wait for a slot, as Prometheus evaluates it.

A debounced message's offset is committed once it is buffered, so its group's lag and age stay
0 while the lane's due turns wait for a free turn slot: the age trigger of a debounced lane
also reads ``pipeline_debounce_overdue_seconds`` (how long the lane's earliest due turn has
waited to be claimed). The queries are evaluated by promtool (``make promtool``) on series as a
scraped member and the ingress export them; without promtool those tests skip.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import k8s_of_kind, promtool_binary

from pipeline.config import RuntimeSettings
from pipeline.topics.spec import TopicSpec
from scripts.manifests import AGE_TARGET_S, lane_manifests

MEMBER = 'job="kubernetes-pods",instance="10.42.0.{n}:9100",pod="consumer-ai-turns-7d9f8c6b5-{pod}"'
INGRESS = 'job="kubernetes-pods",instance="10.42.0.9:9100",pod="ingress-6f7c9d8b4-q8w2n"'
GROUP = 'group="ai_turns",lane="ai_turns"'


def triggers(spec: TopicSpec) -> list[dict[str, Any]]:
    """The triggers scripts/manifests.py writes for ``spec``'s lane."""
    *_, scaled = lane_manifests(spec.lane, [spec], RuntimeSettings())
    return list(scaled["spec"]["triggers"])


def age_trigger(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The one trigger on the age of the oldest waiting message."""
    (age,) = [t for t in found if "pipeline_oldest_message_age_seconds" in t["metadata"]["query"]]
    return age


def test_only_a_debounced_lanes_age_trigger_reads_its_overdue_turns() -> None:
    """The age trigger of a debounced lane reads the lane's overdue turns, at the age target."""
    debounced = TopicSpec.model_validate(
        {"name": "turns", "partitions": 4, "debounce": {"key": "conversation_id", "quiet_s": 5}}
    )
    plain = TopicSpec.model_validate({"name": "replies", "partitions": 4})
    age = age_trigger(triggers(debounced))
    assert 'pipeline_debounce_overdue_seconds{lane="turns"}' in age["metadata"]["query"]
    assert float(age["metadata"]["threshold"]) == AGE_TARGET_S
    assert all(
        "pipeline_debounce_overdue_seconds" not in t["metadata"]["query"] for t in triggers(plain)
    )


def rendered_ai_turns() -> tuple[str, str, str]:
    """The age, slot and forecast queries of consumer-ai-turns as deploy/k8s renders them."""
    (scaled,) = [
        d for d in k8s_of_kind("ScaledObject") if d["metadata"]["name"] == "consumer-ai-turns"
    ]
    age, slots, desired = (t["metadata"]["query"] for t in scaled["spec"]["triggers"])
    return age, slots, desired


@pytest.mark.parametrize(
    ("age_s", "overdue_s", "asked_age_s"),
    [
        (0, 75, 75.0),  # turns wait for slots: all buffered, lag and age 0
        (45, 0, 45.0),  # messages not yet buffered (the members cannot read them fast enough)
        (0, 0, 0.0),  # nothing waits
    ],
)
def test_the_rendered_ai_turns_triggers_ask_for_waiting_turns_and_busy_turn_slots(
    tmp_path: Path, age_s: int, overdue_s: int, asked_age_s: float
) -> None:
    """On a saturated debounced lane (lag 0) the age trigger reads the turns' wait for a slot.

    Two members with all 64 turn slots busy: the slot trigger asks for their 128 busy slots
    (the running turns), with no backlog term (nothing in the lag).
    """
    promtool = promtool_binary()
    age, slots, _ = rendered_ai_turns()
    first, second = MEMBER.format(n=17, pod="x2k4q"), MEMBER.format(n=18, pod="m9z7p")
    series = [
        (f"pipeline_worker_slots_busy{{{first}}}", "64"),
        (f"pipeline_worker_slots_busy{{{second}}}", "64"),
        (f"pipeline_consumer_lag_messages{{{GROUP},{first}}}", "0"),
        (f"pipeline_oldest_message_age_seconds{{{GROUP},{first}}}", f"{age_s}"),
        (f"pipeline_oldest_message_age_seconds{{{GROUP},{INGRESS}}}", f"{age_s}"),
        # every member and the ingress read the same Redis: the same figure
        (f'pipeline_debounce_overdue_seconds{{lane="ai_turns",{first}}}', f"{overdue_s}"),
        (f'pipeline_debounce_overdue_seconds{{lane="ai_turns",{INGRESS}}}', f"{overdue_s}"),
        (f'pipeline_service_time_seconds{{lane="ai_turns",{INGRESS}}}', "3.5"),
    ]
    expected = [(age, asked_age_s), (slots, 128.0)]
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
    result = subprocess.run(
        [str(promtool), "test", "rules", "keda_test.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
