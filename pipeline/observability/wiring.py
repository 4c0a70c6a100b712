"""Ready-made sets of snapshot sources for the processes that serve ``/metrics``.

The ingress calls :func:`ingress_sources` and :func:`sweeper_heartbeat`; a consumer-group
member calls :func:`member_telemetry` (its facades and a ready
:class:`~pipeline.observability.server.MetricsServer` watching its group's lanes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pipeline.logstore import ReplayLog
from pipeline.observability.facades import (
    AdmissionMetrics,
    DebounceMetrics,
    IngressMetrics,
    LagMetrics,
    LogStoreMetrics,
    RetentionLossMetrics,
    SweeperMetrics,
)
from pipeline.observability.lanes import lane_watches
from pipeline.observability.metrics import Metrics
from pipeline.observability.server import MetricsServer
from pipeline.observability.sources import (
    CountingApp,
    GroupLagSource,
    IngressSource,
    LogStoreSource,
    RetentionLossSource,
    SnapshotSource,
)
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Admin

__all__ = [
    "MemberTelemetry",
    "SweepCounts",
    "ingress_sources",
    "member_sources",
    "member_telemetry",
    "sweeper_heartbeat",
]


class SweepCounts(Protocol):
    """What one sweep did (the sweeper's ``SweepReport``)."""

    produced: int
    replayed: int
    abandoned: int
    failed: int
    finished: bool


def ingress_sources(
    metrics: Metrics,
    app: CountingApp,
    store: ReplayLog,
    admin: Admin,
    specs: Sequence[TopicSpec],
    lane_groups: Mapping[str, str],
) -> list[SnapshotSource]:
    """The ingress's counters, its log store, and the lag and age of every declared lane.

    ``lane_groups`` names the group consuming each lane (the sweeper's ``lane_groups``); a lane
    without one is assumed to be consumed by a group of its own name.
    """
    watches = lane_watches(specs, {lane: [group] for lane, group in lane_groups.items()})
    return [
        IngressSource(app, IngressMetrics(metrics)),
        LogStoreSource(store, LogStoreMetrics(metrics)),
        GroupLagSource(admin, watches, LagMetrics(metrics)),
    ]


def member_sources(
    metrics: Metrics, admin: Admin, specs: Sequence[TopicSpec], group: str
) -> list[SnapshotSource]:
    """One member's view of ``group``: its lanes' lag and age, its messages lost to retention."""
    return [
        GroupLagSource(admin, lane_watches(specs, only_groups=[group]), LagMetrics(metrics)),
        RetentionLossSource(RetentionLossMetrics(metrics)),
    ]


def sweeper_heartbeat(metrics: Metrics) -> Callable[[SweepCounts], None]:
    """A sweeper ``on_sweep`` callback: counts its rows; a finished sweep stamps its last run."""
    facade = SweeperMetrics(metrics)

    def on_sweep(report: SweepCounts) -> None:
        facade.swept(
            produced=report.produced,
            replayed=report.replayed,
            abandoned=report.abandoned,
            failed=report.failed,
            finished=report.finished,
        )

    return on_sweep


@dataclass
class MemberTelemetry:
    """Everything a consumer-group member needs to report: facades and its ``/metrics`` server.

    Attributes:
        metrics: the member's registry of every family (deliveries, retries, dead letters,
            parking and slots are written through a
            :class:`~pipeline.observability.facades.RuntimeMetrics` made on it).
        admission: throttle state.
        debounce: debounced turns.
        server: serves ``/metrics`` (with the group's lag and age), ``/healthz``, ``/readyz``;
            run it with :func:`~pipeline.observability.server.serve_metrics` and set
            ``server.ready`` once the member joined its group.
    """

    metrics: Metrics
    admission: AdmissionMetrics
    debounce: DebounceMetrics
    server: MetricsServer


def member_telemetry(
    admin: Admin, specs: Sequence[TopicSpec], group: str, *, interval_s: float = 15.0
) -> MemberTelemetry:
    """The telemetry of one member of ``group`` consuming the lanes of ``specs``."""
    metrics = Metrics()
    server = MetricsServer(
        metrics, member_sources(metrics, admin, specs, group), interval_s=interval_s
    )
    return MemberTelemetry(
        metrics,
        AdmissionMetrics(metrics),
        DebounceMetrics(metrics),
        server,
    )
