"""Ready-made sets of snapshot sources for the processes that serve ``/metrics``.

The ingress calls :func:`ingress_sources` and :func:`sweeper_heartbeat`; a consumer-group
member calls :func:`member_telemetry` (its facades and a ready
:class:`~pipeline.observability.server.MetricsServer` watching its group's lanes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis

from pipeline.logstore import ReplayLog
from pipeline.observability.facades import (
    AdmissionMetrics,
    DebounceMetrics,
    HeldReleaseMetrics,
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
    DebounceOverdueSource,
    GroupLagSource,
    HeldReleaseOverdueSource,
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
    "debounce_sources",
    "held_release_sources",
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
    *,
    redis: Redis | None = None,
    redis_prefix: str = "",
) -> list[SnapshotSource]:
    """The ingress's counters, its log store, and the lag and age of every declared lane.

    ``lane_groups`` names the group consuming each lane (the sweeper's ``lane_groups``); a lane
    without one is assumed to be consumed by a group of its own name. With ``redis`` (the
    members' Redis, keys under ``redis_prefix``), the debounced lanes' overdue turns and the
    ordered lanes' overdue releases of held followers too: the ingress outlives the members
    that would report them.
    """
    watches = lane_watches(specs, {lane: [group] for lane, group in lane_groups.items()})
    sources: list[SnapshotSource] = [
        IngressSource(app, IngressMetrics(metrics)),
        LogStoreSource(store, LogStoreMetrics(metrics)),
        GroupLagSource(admin, watches, LagMetrics(metrics)),
    ]
    if redis is not None:
        sources += debounce_sources(metrics, redis, redis_prefix, specs)
        sources += held_release_sources(metrics, redis, redis_prefix, specs)
    return sources


def waits_in_members_redis(specs: Sequence[TopicSpec]) -> bool:
    """Whether work of ``specs`` can wait in the members' Redis (debounced turns, held followers).

    Such work has its offsets committed, so no broker figure shows it: the ingress reads its
    overdue gauges from that Redis too (:func:`debounce_sources`, :func:`held_release_sources`).
    """
    return any(_debounced(spec) or _holds_followers(spec) for spec in specs)


def _debounced(spec: TopicSpec) -> bool:
    return spec.debounce is not None


def _holds_followers(spec: TopicSpec) -> bool:
    """Only an ordered lane with retry tiers holds followers, behind a parked key."""
    return spec.ordered and bool(spec.retry.tiers_ms)


def debounce_sources(
    metrics: Metrics, redis: Redis, redis_prefix: str, specs: Sequence[TopicSpec]
) -> list[SnapshotSource]:
    """How long the earliest turn of each debounced lane of ``specs`` has been due; [] if none.

    ``redis`` is the members' Redis (a client returning bytes, kept and closed by the caller),
    its debounce keys under ``redis_prefix``.
    """
    lanes = sorted({spec.lane for spec in specs if _debounced(spec)})
    if not lanes:
        return []
    return [DebounceOverdueSource(redis, redis_prefix, lanes, DebounceMetrics(metrics))]


def held_release_sources(
    metrics: Metrics, redis: Redis, redis_prefix: str, specs: Sequence[TopicSpec]
) -> list[SnapshotSource]:
    """How long past its lease each ordered lane's oldest release of held followers is; [] if none.

    Only an ordered lane with retry tiers holds followers (behind a parked key). ``redis`` is
    the members' Redis (kept and closed by the caller), its guard keys under ``redis_prefix``.
    """
    lanes = sorted({spec.lane for spec in specs if _holds_followers(spec)})
    if not lanes:
        return []
    return [HeldReleaseOverdueSource(redis, redis_prefix, lanes, HeldReleaseMetrics(metrics))]


def member_sources(
    metrics: Metrics,
    admin: Admin,
    specs: Sequence[TopicSpec],
    group: str,
    *,
    redis: Redis | None = None,
    redis_prefix: str = "",
) -> list[SnapshotSource]:
    """One member's view of ``group``: its lanes' lag and age, its messages lost to retention.

    With ``redis`` (keys under ``redis_prefix``), its debounced lanes' overdue turns and its
    ordered lanes' overdue releases of held followers too.
    """
    sources: list[SnapshotSource] = [
        GroupLagSource(admin, lane_watches(specs, only_groups=[group]), LagMetrics(metrics)),
        RetentionLossSource(RetentionLossMetrics(metrics)),
    ]
    if redis is not None:
        sources += debounce_sources(metrics, redis, redis_prefix, specs)
        sources += held_release_sources(metrics, redis, redis_prefix, specs)
    return sources


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
    admin: Admin,
    specs: Sequence[TopicSpec],
    group: str,
    *,
    interval_s: float = 15.0,
    redis: Redis | None = None,
    redis_prefix: str = "",
) -> MemberTelemetry:
    """The telemetry of one member of ``group`` consuming the lanes of ``specs``.

    With ``redis`` (the member's client, keys under ``redis_prefix``) its ``/metrics`` shows
    how long its debounced lanes' earliest turns have been due.
    """
    metrics = Metrics()
    sources = member_sources(metrics, admin, specs, group, redis=redis, redis_prefix=redis_prefix)
    server = MetricsServer(metrics, sources, interval_s=interval_s)
    return MemberTelemetry(
        metrics,
        AdmissionMetrics(metrics),
        DebounceMetrics(metrics),
        server,
    )
