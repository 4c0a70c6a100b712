"""The metric families and the facades the stages call."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from pipeline.observability import metrics as m
from pipeline.observability.facades import (
    AdmissionMetrics,
    DebounceMetrics,
    IngressMetrics,
    LagMetrics,
    LogStoreMetrics,
    OffloadMetrics,
    RuntimeMetrics,
    SweeperMetrics,
)
from pipeline.observability.metrics import FAMILIES, TOP_TENANTS, Metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    """One sample's value from the registry, or None."""
    return metrics.registry.get_sample_value(name, labels)


def test_family_names_follow_the_conventions():
    """Names are unique, prefixed, counters end in _total and units are in the names."""
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names))
    suffixes = {"seconds": "_seconds", "ratio": "_ratio"}
    for family in FAMILIES:
        assert family.name.startswith("pipeline_")
        assert family.name.endswith("_total") == (family.kind == "counter"), family.name
        suffix = suffixes.get(family.unit)
        if suffix is not None:
            assert family.name.removesuffix("_total").endswith(suffix), family.name
        assert family.help
        assert bool(family.buckets) == (family.kind == "histogram")


def test_no_family_is_labelled_by_key_and_only_one_by_tenant():
    """Label sets stay bounded: no key label, and a tenant label only on the top-N gauge."""
    for family in FAMILIES:
        assert "key" not in family.labels
        if "tenant" in family.labels:
            assert family is m.THROTTLED_TENANTS


def test_each_metrics_object_has_its_own_registry():
    """Two Metrics objects in one process do not share or clash on families."""
    first, second = Metrics(), Metrics()
    RuntimeMetrics(first).expired("messages")
    assert sample(first, "pipeline_expired_total", lane="messages") == 1
    assert sample(second, "pipeline_expired_total", lane="messages") is None


def test_a_registry_shows_only_the_unlabelled_families_its_process_writes():
    """An unlabelled family shows a sample from its creation on, so it is made on first use.

    Made with the registry, every ingress pod showed the members' slot utilisation as 0, and
    the saturation alert (an average over every scraped pod) could not fire.
    """
    metrics = Metrics()
    for facade in (IngressMetrics, LogStoreMetrics, LagMetrics, SweeperMetrics, OffloadMetrics):
        facade(metrics)  # the ingress's facades
    shown = generate_latest(metrics.registry).decode()
    for family in (m.SLOT_UTILISATION, m.SLOTS_TOTAL, m.SLOTS_BUSY, m.LONG_WORK):
        assert family.name not in shown
    RuntimeMetrics(metrics).slots(busy=3, total=4)
    assert sample(metrics, "pipeline_worker_slot_utilization_ratio") == 0.75


def test_runtime_facade_records_deliveries_retries_and_slots():
    """A delivery counts once and is timed; retries, dead letters, parking and slots show."""
    metrics = Metrics()
    runtime = RuntimeMetrics(metrics)
    runtime.delivered("messages", "handled", 0.2)
    runtime.delivered("messages", "handled", 3.0)
    runtime.retried("messages", "5s")
    runtime.dead_lettered("messages", "exhausted")
    runtime.parked_keys("messages", 1)
    runtime.slots(16, 64)
    assert sample(metrics, "pipeline_deliveries_total", lane="messages", outcome="handled") == 2
    count = sample(
        metrics, "pipeline_handler_duration_seconds_count", lane="messages", outcome="handled"
    )
    assert count == 2
    assert sample(
        metrics, "pipeline_handler_duration_seconds_sum", lane="messages", outcome="handled"
    ) == pytest.approx(3.2)
    assert sample(metrics, "pipeline_retries_total", lane="messages", tier="5s") == 1
    assert sample(metrics, "pipeline_dead_letters_total", lane="messages", reason="exhausted") == 1
    assert sample(metrics, "pipeline_parked_keys", lane="messages") == 1
    assert sample(metrics, "pipeline_worker_slot_utilization_ratio") == 0.25


def test_throttled_tenants_are_capped_to_the_top_n():
    """Only the most throttled tenants are exported, and those that leave the top disappear."""
    metrics = Metrics()
    admission = AdmissionMetrics(metrics)
    admission.throttled_tenants("engagement", {f"t{i:02d}": i for i in range(1, 21)})
    exported = [
        s.labels["tenant"]
        for metric in metrics.registry.collect()
        if metric.name == "pipeline_throttled_tenant_waiting"
        for s in metric.samples
    ]
    assert len(exported) == TOP_TENANTS
    assert "t20" in exported
    assert "t01" not in exported
    admission.throttled_tenants("engagement", {"flood": 500})
    assert (
        sample(metrics, "pipeline_throttled_tenant_waiting", lane="engagement", tenant="t20")
        is None
    )
    assert (
        sample(metrics, "pipeline_throttled_tenant_waiting", lane="engagement", tenant="flood")
        == 500
    )


def test_admission_and_debounce_facades():
    """Grants, fail-open admissions, waiting counts and turn statistics are recorded."""
    metrics = Metrics()
    admission = AdmissionMetrics(metrics)
    admission.granted("ai_turns", 3)
    admission.failed_open("ai_turns")
    admission.waiting("ai_turns", 7)
    debounce = DebounceMetrics(metrics)
    debounce.turn("ai_turns", messages=4, lateness_s=0.3)
    debounce.superseded("ai_turns")
    assert sample(metrics, "pipeline_throttle_grants_total", lane="ai_turns") == 3
    assert sample(metrics, "pipeline_throttle_fail_open_total", lane="ai_turns") == 1
    assert sample(metrics, "pipeline_throttle_waiting", lane="ai_turns") == 7
    assert sample(metrics, "pipeline_debounce_turns_total", lane="ai_turns") == 1
    assert sample(metrics, "pipeline_debounce_superseded_total", lane="ai_turns") == 1
    assert sample(metrics, "pipeline_debounce_turn_messages_sum", lane="ai_turns") == 4


def test_ingress_sync_adds_only_the_growth_of_cumulative_counters():
    """Syncing twice adds each request once, splits outcome and reason, and survives a reset."""
    metrics = Metrics()
    ingress = IngressMetrics(metrics)
    counts = {("github", "accepted"): 3, ("github", "rejected:signature mismatch"): 1}
    ingress.sync(counts, produced=3)
    ingress.sync({**counts, ("github", "accepted"): 5}, produced=5)
    assert (
        sample(
            metrics,
            "pipeline_ingress_requests_total",
            source="github",
            outcome="accepted",
            reason="",
        )
        == 5
    )
    assert (
        sample(
            metrics,
            "pipeline_ingress_requests_total",
            source="github",
            outcome="rejected",
            reason="signature mismatch",
        )
        == 1
    )
    assert sample(metrics, "pipeline_ingress_produced_total") == 5
    ingress.sync({}, produced=2)  # a new dispatcher starts from zero again
    assert sample(metrics, "pipeline_ingress_produced_total") == 7


def test_log_store_sweeper_and_lag_facades():
    """Log ages, abandoned rows, the sweeper heartbeat and lane gauges are set."""
    metrics = Metrics()
    LogStoreMetrics(metrics).observe(unproduced_age_s=1.5, unprocessed_age_s=9.0, abandoned=2)
    SweeperMetrics(metrics, clock=lambda: 1_700_000_000.0).swept(
        produced=1, replayed=2, abandoned=0, failed=0
    )
    lag = LagMetrics(metrics)
    lag.lane("messages", "replies", lag=12, oldest_age_s=33.0)
    lag.retry_tier("messages", "replies", "1m", 4)
    lag.dead_letters("messages", 5)
    assert sample(metrics, "pipeline_log_oldest_unprocessed_age_seconds") == 9.0
    assert sample(metrics, "pipeline_log_abandoned_rows") == 2
    assert sample(metrics, "pipeline_sweeper_last_run_timestamp_seconds") == 1_700_000_000.0
    assert sample(metrics, "pipeline_sweeper_rows_total", action="replayed") == 2
    assert (
        sample(metrics, "pipeline_oldest_message_age_seconds", lane="messages", group="replies")
        == 33
    )
    assert sample(metrics, "pipeline_consumer_lag_messages", lane="messages", group="replies") == 12
    assert (
        sample(metrics, "pipeline_retry_tier_messages", lane="messages", group="replies", tier="1m")
        == 4
    )
    assert sample(metrics, "pipeline_dead_letter_messages", lane="messages") == 5
