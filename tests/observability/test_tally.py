"""The outcome tally scrapes exactly as prometheus-client's own counter and histogram would.

The member counts deliveries in plain numbers (``observability/tally.py``) instead of the
library's locked instruments; dashboards and alerts must not see the difference. The library's
instruments, fed the same observations, are the reference.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.observability import metrics as m
from pipeline.observability.facades import RuntimeMetrics
from pipeline.observability.metrics import Metrics
from pipeline.observability.tally import OutcomeTally

# Below, on, between and above the bounds, and past the last one.
DURATIONS = [0.0, 0.001, 0.005, 0.0050001, 0.3, 1.0, 2.5, 7.0, 300.0, 301.0, 4000.0]


def _samples(registry: CollectorRegistry) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_scrape_matches_the_library_instruments() -> None:
    """Bucket by bucket, count and sum, per label set."""
    reference = CollectorRegistry()
    counter = Counter(m.DELIVERIES.name, m.DELIVERIES.help, m.DELIVERIES.labels, registry=reference)
    histogram = Histogram(
        m.HANDLER_DURATION.name,
        m.HANDLER_DURATION.help,
        m.HANDLER_DURATION.labels,
        registry=reference,
        buckets=m.HANDLER_DURATION.buckets,
    )
    ours = CollectorRegistry()
    tally = OutcomeTally(m.DELIVERIES, m.HANDLER_DURATION)
    ours.register(tally)
    for i, duration in enumerate(DURATIONS * 3):
        labels = ("orders", "handled" if i % 3 else "retried")
        counter.labels(*labels).inc()
        histogram.labels(*labels).observe(duration)
        tally.add(labels, duration)
    assert _samples(ours) == _samples(reference)


def test_member_deliveries_are_readable_from_the_registry() -> None:
    """What the capacity planner reads (count and sum by lane and outcome) comes from the tally."""
    metrics = Metrics()
    runtime = RuntimeMetrics(metrics)
    runtime.delivered("orders", "handled", 0.25)
    runtime.delivered("orders", "handled", 0.5)
    runtime.delivered("orders", "dead_lettered", 1.0)
    labels = {"lane": "orders", "outcome": "handled"}
    registry = metrics.registry
    assert registry.get_sample_value("pipeline_deliveries_total", labels) == 2
    assert registry.get_sample_value("pipeline_handler_duration_seconds_count", labels) == 2
    assert registry.get_sample_value("pipeline_handler_duration_seconds_sum", labels) == 0.75
    dead = {"lane": "orders", "outcome": "dead_lettered"}
    assert registry.get_sample_value("pipeline_deliveries_total", dead) == 1


def test_families_of_other_kinds_are_refused() -> None:
    """Counter and histogram swapped is a programming error, said at once."""
    with pytest.raises(TypeError, match="must be a counter"):
        OutcomeTally(m.HANDLER_DURATION, m.DELIVERIES)
