"""deploy/: alert rules and KEDA triggers read defined metrics and labels; runbook anchors exist."""

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
    "abs", "absent", "and", "avg", "bool", "by", "ceil", "clamp_max", "clamp_min", "count",
    "delta", "deriv", "floor", "group_left",
    "group_right", "histogram_quantile", "ignoring", "increase", "irate", "label_replace",
    "max", "min",
    "offset", "on", "or", "rate", "round", "sum", "time", "topk", "unless", "vector", "without",
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


SCRAPE_LABELS = {"job", "instance", "pod"}
"""Labels Prometheus adds to every scraped series (the manifests' pod annotation gives ``pod``)."""
FAMILY_OF = {
    **{name: family for family in FAMILIES for name in family.exposed_names()},
    **{
        family.name.removesuffix("_total") + "_created": family
        for family in FAMILIES
        if family.kind == "counter"
    },
}
"""Each sample name a scrape shows, to its family."""


def _replaced_labels(expr: str) -> set[str]:
    """The labels label_replace() writes (its second argument)."""
    return set(re.findall(r'label_replace\((?:[^()"]|\([^()]*\))*?,\s*"(\w+)"', expr))


def promql_problems(expr: str) -> list[str]:
    """What in ``expr`` reads a series no scrape of the pipeline has.

    A selector's matchers and the labels of ``by``/``on``/``without``/``ignoring``/``group_*``
    are labels of the families used (or Prometheus's own scrape labels, or one label_replace
    writes); rate/irate/increase read counters (or a histogram's samples), delta/deriv gauges.
    """
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    problems = [f"no metric {name}" for name in metric_names(expr) if name not in FAMILY_OF]
    used = [FAMILY_OF[name] for name in metric_names(expr) if name in FAMILY_OF]
    known = {label for family in used for label in family.labels}
    known |= SCRAPE_LABELS | _replaced_labels(expr)
    for name, body in re.findall(r"\b([a-zA-Z_:][\w:]*)\{([^}]*)\}", expr):
        family = FAMILY_OF.get(name)
        labels = re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", body)
        allowed = (set(family.labels) if family else set()) | SCRAPE_LABELS
        if name.endswith("_bucket"):
            allowed.add("le")
        problems += [f"{name} has no label {label}" for label in labels if label not in allowed]
    grouping = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"
    for clause in re.findall(grouping, bare):
        for label in re.findall(r"\w+", clause):
            if label not in known | {"le"}:
                problems.append(f"no metric of the expression has the label {label}")
    return problems + _kind_problems(bare)


def _kind_problems(bare: str) -> list[str]:
    """rate/irate/increase given a gauge, or delta/deriv given a counter or histogram."""
    problems = []
    for function, name in re.findall(r"\b(rate|irate|increase|delta|deriv)\(\s*(\w+)", bare):
        family = FAMILY_OF.get(name)
        if family is None:
            continue
        if function in ("rate", "irate", "increase"):
            wrong = family.kind == "gauge"
        else:
            wrong = family.kind != "gauge" or name.endswith("_created")
        if wrong:
            problems.append(f"{function}() of {name}, a {family.kind}")
    return problems


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule["alert"])
def test_rule_reads_the_labels_its_metrics_have(rule):
    """Every label the expression matches, groups or joins on is one its metrics are scraped by."""
    assert promql_problems(rule["expr"]) == []


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule["alert"])
def test_rule_annotations_use_labels_the_alert_has(rule):
    """A {{ $labels.X }} in an annotation is a label the expression keeps (not rendered empty)."""
    kept = set()
    for clause in re.findall(r"\bby\s*\(([^)]*)\)", rule["expr"]):
        kept |= set(re.findall(r"\w+", clause))
    kept |= _replaced_labels(rule["expr"])
    for text in rule["annotations"].values():
        for label in re.findall(r"\$labels\.(\w+)", text):
            assert label in kept, f"{rule['alert']}: {label} is not kept by {rule['expr']}"


def keda_queries() -> list[tuple[str, str]]:
    """(where, query) of every Prometheus trigger of every ScaledObject under deploy/k8s."""
    found = []
    for path in sorted((ROOT / "deploy" / "k8s").rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(document, dict) or document.get("kind") != "ScaledObject":
                continue
            for index, trigger in enumerate(document["spec"]["triggers"]):
                if trigger["type"] == "prometheus":
                    where = f"{path.relative_to(ROOT)}#{index}"
                    found.append((where, trigger["metadata"]["query"]))
    return found


def generated_queries() -> list[tuple[str, str]]:
    """The queries scripts/manifests.py writes for a batch lane and a lane of long work."""
    from pipeline.config import RuntimeSettings  # noqa: PLC0415 - only these tests need them
    from pipeline.topics.spec import TopicSpec  # noqa: PLC0415
    from scripts.manifests import lane_manifests  # noqa: PLC0415

    found = []
    for declared in (
        {"name": "reindex", "partitions": 4, "batch": {"sla": "12h", "promote_at": 0.75}},
        {"name": "vision", "partitions": 12, "heartbeat_timeout": "5m"},
        {"name": "chat", "partitions": 6},
    ):
        spec = TopicSpec.model_validate(declared)
        *_, scaled = lane_manifests(spec.lane, [spec], RuntimeSettings())
        for index, trigger in enumerate(scaled["spec"]["triggers"]):
            found.append((f"{spec.lane}#{index}", trigger["metadata"]["query"]))
    return found


def test_every_keda_query_reads_exported_metrics_with_their_labels():
    """Each ScaledObject trigger (deploy/k8s and generated) reads defined metrics and labels.

    A trigger on a name or label no member exports reads nothing: it never scales.
    """
    queries = keda_queries() + generated_queries()
    assert len(queries) >= 10
    wrong = [f"{where}: {problem}" for where, q in queries for problem in promql_problems(q)]
    assert wrong == []


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ('max(pipeline_oldest_message_age_seconds{lane="a",tier="5s"})', "has no label tier"),
        ("max by (lane, tenant) (pipeline_oldest_message_age_seconds)", "the label tenant"),
        ("sum(rate(pipeline_consumer_lag_messages[5m]))", "rate() of pipeline_consumer_lag"),
        ("delta(pipeline_dead_letters_total[5m])", "delta() of pipeline_dead_letters_total"),
        ("max(pipeline_oldest_message_age)", "no metric pipeline_oldest_message_age"),
        ("sum(pipeline_worker_slots_busy) on (lane) max(pipeline_batch_sla_seconds)", None),
    ],
)
def test_the_promql_check_catches_what_it_is_for(expr, problem):
    """A wrong label, a gauge given to rate() or a counter to delta() is reported."""
    problems = promql_problems(expr)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems
