"""A producer's ``pl-tenant`` is a metric label: its size is bounded like a Redis key's name."""

from __future__ import annotations

from prometheus_client import generate_latest

from pipeline.admission.keys import org_name
from pipeline.observability.facades import AdmissionMetrics
from pipeline.observability.metrics import Metrics
from pipeline.redis_keys import HEAD_CHARS, NAME_PART_MAX_BYTES


def _tenant_labels(metrics: Metrics) -> list[str]:
    return [
        s.labels["tenant"]
        for metric in metrics.registry.collect()
        if metric.name == "pipeline_throttled_tenant_waiting"
        for s in metric.samples
    ]


def test_a_huge_tenant_is_exported_by_its_head_and_digest() -> None:
    """Ten 256 KiB tenants made a 2.5 MiB exposition; each label is at most 328 bytes now."""
    metrics = Metrics()
    admission = AdmissionMetrics(metrics)
    huge = {f"org:{i}:" + "x" * (256 * 1024): 5 + i for i in range(10)}
    admission.throttled_tenants("engagement", {**huge, "org:small": 1})
    labels = _tenant_labels(metrics)
    assert len(labels) == 10
    assert all(len(label.encode()) <= HEAD_CHARS + 72 for label in labels)
    assert sorted(labels) == sorted(org_name(tenant) for tenant in huge)
    assert len(set(labels)) == 10  # distinct tenants keep distinct labels
    assert len(generate_latest(metrics.registry)) < 64 * 1024
    # One that leaves the top is removed under the same bounded label.
    admission.throttled_tenants("engagement", {"org:small": 3})
    assert _tenant_labels(metrics) == ["org:small"]


def test_a_tenant_within_the_bound_keeps_its_name() -> None:
    """While its key org:TENANT fits the bound the label is the tenant, as status shows it."""
    metrics = Metrics()
    admission = AdmissionMetrics(metrics)
    tenant = "org:" + "é" * ((NAME_PART_MAX_BYTES - 8) // 2)  # its key org:TENANT fits
    admission.throttled_tenants("engagement", {tenant: 2})
    assert _tenant_labels(metrics) == [tenant]
