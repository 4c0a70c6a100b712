"""deploy/prometheus/alerts.yaml: well-formed rules on defined metrics, with runbook anchors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pipeline.observability.metrics import FAMILIES

ROOT = Path(__file__).parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
RUNBOOK = ROOT / "docs" / "operations.md"
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
# PromQL words that look like metric names: functions, aggregations, keywords, modifiers.
PROMQL_WORDS = {
    "abs", "absent", "and", "avg", "bool", "by", "count", "delta", "deriv", "group_left",
    "group_right", "histogram_quantile", "ignoring", "increase", "irate", "label_replace",
    "max", "min",
    "offset", "on", "or", "rate", "sum", "time", "topk", "unless", "without",
}  # fmt: skip


def rules() -> list[dict]:
    """Every rule of the file."""
    document = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    """Metric names used in a PromQL expression (label matchers, strings and ranges removed)."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    bare = re.sub(r"\{[^}]*\}", "", bare)  # label matchers
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # range selectors
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
    words = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", bare))
    return {w for w in words if w not in PROMQL_WORDS and not re.fullmatch(r"\d+\w*", w)}


def anchors(markdown: str) -> set[str]:
    """GitHub-style anchors of the headings of a Markdown document."""
    found = set()
    for heading in re.findall(r"^#+\s+(.+)$", markdown, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_the_file_has_groups_of_named_rules():
    """The file parses into groups, each with a name and at least one rule."""
    document = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    assert document["groups"]
    for group in document["groups"]:
        assert group["name"]
        assert group["rules"]
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule["alert"])
def test_rule_is_complete(rule):
    """Each alert has an expr, a duration, a severity and summary/description/runbook_url."""
    assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
    assert rule["expr"].strip()
    assert DURATION.match(rule["for"])
    assert rule["labels"]["severity"] in {"page", "ticket"}
    annotations = rule["annotations"]
    assert annotations["summary"].strip()
    assert len(annotations["description"]) > 80, "say what the paged person faces"
    assert annotations["runbook_url"].startswith("docs/operations.md#")


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule["alert"])
def test_rule_uses_only_defined_metrics(rule):
    """Every metric name in the expression is a family defined in metrics.py (or its _created)."""
    defined = {name for family in FAMILIES for name in family.exposed_names()}
    # prometheus_client exports each counter's creation time beside it (a scrape shows
    # pipeline_dead_letters_created next to pipeline_dead_letters_total).
    defined |= {
        family.name.removesuffix("_total") + "_created"
        for family in FAMILIES
        if family.kind == "counter"
    }
    used = metric_names(rule["expr"])
    assert used, rule["expr"]
    assert used <= defined, used - defined


def test_runbook_links_point_at_existing_sections():
    """Every runbook_url anchor is a heading of docs/operations.md."""
    existing = anchors(RUNBOOK.read_text(encoding="utf-8"))
    for rule in rules():
        anchor = rule["annotations"]["runbook_url"].partition("#")[2]
        assert anchor in existing, f"{rule['alert']}: #{anchor} is not a heading"


def test_the_age_signal_pages():
    """The oldest-message age is alerted on at page severity (the alarm signal)."""
    paging = [r for r in rules() if r["labels"]["severity"] == "page"]
    assert any("pipeline_oldest_message_age_seconds" in r["expr"] for r in paging)


def test_metric_name_parser_ignores_labels_functions_and_durations():
    """The expression parser finds the metric names and nothing else."""
    expr = (
        'sum by (lane) (increase(pipeline_dead_letters_total{reason="fatal"}[10m])) > 0 '
        "or absent(pipeline_sweeper_last_run_timestamp_seconds) and time() - 5"
    )
    assert metric_names(expr) == {
        "pipeline_dead_letters_total",
        "pipeline_sweeper_last_run_timestamp_seconds",
    }


def test_slot_saturation_is_judged_per_fleet():
    """The fleet is the pod name without its suffix: each consumer Deployment is judged alone.

    Before, one average over every member let a saturated fleet hide behind idle ones.
    """
    (rule,) = [r for r in rules() if r["alert"] == "PipelineWorkerSlotsSaturated"]
    assert rule["expr"].startswith("avg by (fleet)")
    pattern = re.search(r'"pod", "([^"]+)"', rule["expr"])
    assert pattern is not None
    fleet = re.compile(pattern.group(1))  # Prometheus anchors it; Go's RE2 matches as re here
    for pod, expected in (
        ("consumer-messages-7d9f8c6b5-x2k4q", "consumer-messages"),
        ("consumer-ai-turns-5c8b7d6f4-abcde", "consumer-ai-turns"),
        ("consumer-ai-turns-0", "consumer-ai-turns"),
        ("consumer-engagement-12", "consumer-engagement"),
    ):
        match = fleet.fullmatch(pod)
        assert match is not None, pod
        assert match.group(1) == expected, pod
    assert fleet.fullmatch("laptop") is None  # no fleet label: one fleet ""
