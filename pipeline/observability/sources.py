"""The expensive readings behind the ``/metrics`` snapshot, run only by its refresher.

Each :class:`SnapshotSource` reads something that costs a round trip (the broker's group lag,
the log store) or copies counters kept elsewhere, and writes the result into the metrics through
a facade. :class:`~pipeline.observability.server.MetricsServer` calls :meth:`refresh` in the
background with a timeout, so a scrape never waits on Redis, Kafka or the database.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from redis.asyncio import Redis

from pipeline.admission.debounce.keys import due_key
from pipeline.errors import DebounceUnavailable, PipelineError
from pipeline.logstore import ReplayLog, RowState, Selection
from pipeline.observability.facades import (
    DebounceMetrics,
    HeldReleaseMetrics,
    IngressMetrics,
    LagMetrics,
    LogStoreMetrics,
    RetentionLossMetrics,
)
from pipeline.observability.lanes import LaneReport, LaneWatch, probe_lane, retained_dead_letters
from pipeline.redis_functions import FAILED
from pipeline.retry.keys import guard_keys
from pipeline.transport.protocol import Admin
from pipeline.transport.retention import lost_to_retention

__all__ = [
    "CountingApp",
    "DebounceOverdueSource",
    "GroupLagSource",
    "HeldReleaseOverdueSource",
    "IngressSource",
    "LogStoreSource",
    "SnapshotSource",
]


class SnapshotSource(Protocol):
    """Something the refresher reads before it renders a snapshot."""

    name: str
    """A short label for the refresh error counter (bounded: one per source kind)."""

    async def refresh(self) -> None:
        """Read and write the latest values into the metrics; may raise or hang."""
        ...


class GroupLagSource:
    """Lag, oldest-message age, retry-tier depths and lateness, dead letters per (lane, group)."""

    name = "group_lag"

    def __init__(
        self,
        admin: Admin,
        watches: Sequence[LaneWatch],
        metrics: LagMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Read ``watches`` with ``admin`` and write into ``metrics``."""
        self._admin = admin
        self._watches = list(watches)
        self._metrics = metrics
        self._clock = clock
        self.reports: list[LaneReport] = []
        """What the last refresh found."""

    async def refresh(self) -> None:
        """Probe every watched lane and update the gauges."""
        retained = await retained_dead_letters(self._admin, self._watches)
        reports = []
        for watch in self._watches:
            report = await probe_lane(self._admin, watch, retained, clock=self._clock)
            self._metrics.lane(
                report.lane, report.group, lag=report.lag, oldest_age_s=report.oldest_age_s
            )
            for tier, depth in report.retry_tiers.items():
                overdue_s = report.retry_overdue_s.get(tier, 0.0)
                self._metrics.retry_tier(report.lane, report.group, tier, depth, overdue_s)
            self._metrics.dead_letters(report.lane, report.dead_letters)
            reports.append(report)
        self.reports = reports


class DebounceOverdueSource:
    """How long the earliest turn of each debounced lane has been due, read from Redis.

    A debounced message's offset is committed once it is recorded, so a turn no member runs
    (the lane's members died, or none runs the lane) shows in no lag or age: only in the lane's
    sorted set of due times (``{P:deb:LANE}:due``), where a waiting turn's score is its due time
    and a running turn's its lease expiry. One pipelined round trip reads Redis's ``TIME`` and
    each lane's lowest score; due times are Redis-clock, so they are compared with its clock.
    """

    name = "debounce_overdue"

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        lanes: Sequence[str],
        metrics: DebounceMetrics,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """Read ``lanes``' due times under ``prefix`` in ``redis`` and write into ``metrics``.

        ``clock`` gives the time in seconds to compare them with; None (the default) reads
        Redis's ``TIME``. The caller keeps ``redis`` and closes it.
        """
        self._redis = redis
        self._prefix = prefix
        self._lanes = list(lanes)
        self._metrics = metrics
        self._clock = clock

    async def refresh(self) -> None:
        """Set ``pipeline_debounce_overdue_seconds`` for every lane (0 when nothing is due).

        Raises:
            DebounceUnavailable: Redis cannot be reached or answered an error.
        """
        keys = [due_key(self._prefix, lane) for lane in self._lanes]
        try:
            now_ms, earliest = await _lowest_scores(self._redis, keys)
        except FAILED as exc:
            lanes = ", ".join(self._lanes)
            raise DebounceUnavailable(f"debounce due times of lanes {lanes}: {exc}") from exc
        if self._clock is not None:
            now_ms = int(self._clock() * 1000)
        for lane, due_ms in zip(self._lanes, earliest, strict=True):
            self._metrics.overdue(lane, _overdue_s(now_ms, due_ms))


class HeldReleaseOverdueSource:
    """How long past its lease each ordered lane's oldest release of held followers is.

    Followers held behind a parked key have their offsets committed: Redis holds their only
    copy, and once the head's copy succeeded they wait only for their release, which its member
    holds under a lease renewed every commit tick (``{P:guard:LANE}:rel``, key -> lease expiry,
    Redis clock) and another member's reaper takes over once it ran out. A release whose lease
    ran out long ago is one no member takes over (the lane's members died in a quiet hour, or
    none reaps it), which no lag, age or retry-tier gauge shows. One pipelined round trip reads
    Redis's ``TIME`` and each lane's lowest lease expiry.
    """

    name = "held_release_overdue"

    def __init__(
        self, redis: Redis, prefix: str, lanes: Sequence[str], metrics: HeldReleaseMetrics
    ) -> None:
        """Read ``lanes``' releases under ``prefix`` in ``redis`` (the caller closes it)."""
        self._redis = redis
        self._keys = [guard_keys(prefix, lane).releases for lane in lanes]
        self._lanes = list(lanes)
        self._metrics = metrics

    async def refresh(self) -> None:
        """Set ``pipeline_held_release_overdue_seconds`` for every lane (0: none past its lease).

        Raises:
            PipelineError: Redis cannot be reached or answered an error.
        """
        try:
            now_ms, earliest = await _lowest_scores(self._redis, self._keys)
        except FAILED as exc:
            lanes = ", ".join(self._lanes)
            raise PipelineError(f"held-follower releases of lanes {lanes}: {exc}") from exc
        for lane, expiry_ms in zip(self._lanes, earliest, strict=True):
            self._metrics.overdue(lane, _overdue_s(now_ms, expiry_ms))


async def _lowest_scores(redis: Redis, keys: Sequence[str]) -> tuple[int, list[float | None]]:
    """Redis's ``TIME`` in ms and each sorted set's lowest score (None: empty), one round trip.

    Raises:
        RedisError, RedisClusterException, OSError: Redis cannot be reached or answered an error.
    """
    async with redis.pipeline(transaction=False) as pipe:
        pipe.time()
        for key in keys:
            pipe.zrange(key, 0, 0, withscores=True)
        replies = await pipe.execute()
    seconds, micros = replies[0]
    return seconds * 1000 + micros // 1000, [zset[0][1] if zset else None for zset in replies[1:]]


def _overdue_s(now_ms: int, due_ms: float | None) -> float:
    """Seconds ``now_ms`` is past ``due_ms`` (0: not yet, or nothing due)."""
    return 0.0 if due_ms is None else max(0.0, (now_ms - due_ms) / 1000)


class RetentionLossSource:
    """Messages this process's consumers found removed by retention before their group read them."""

    name = "lost_to_retention"

    def __init__(self, metrics: RetentionLossMetrics) -> None:
        """Write into ``metrics``."""
        self._metrics = metrics

    async def refresh(self) -> None:
        """Count what the transports reported since the last refresh."""
        self._metrics.sync(lost_to_retention())


class LogStoreSource:
    """Ages of the oldest unproduced and unprocessed rows, and the abandoned count."""

    name = "log_store"

    def __init__(
        self,
        store: ReplayLog,
        metrics: LogStoreMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Read ``store`` and write into ``metrics``."""
        self._store = store
        self._metrics = metrics
        self._clock = clock

    async def refresh(self) -> None:
        """Three small queries: the oldest received row, the oldest produced one, a count."""
        now_ms = int(self._clock() * 1000)
        counts = await self._store.count_by_state(Selection(states=(RowState.ABANDONED,)))
        self._metrics.observe(
            unproduced_age_s=await self._oldest_age_s(RowState.RECEIVED, now_ms),
            unprocessed_age_s=await self._oldest_age_s(RowState.PRODUCED, now_ms),
            abandoned=counts.get(RowState.ABANDONED, 0),
        )

    async def _oldest_age_s(self, state: RowState, now_ms: int) -> float:
        # Row ids are time-ordered, so the first row in id order is the oldest received.
        rows = await self._store.select(Selection(states=(state,)), limit=1)
        return max(0.0, (now_ms - rows[0].received_at_ms) / 1000) if rows else 0.0


class _DispatchCounters(Protocol):
    produced: int
    failed: int
    overflowed: int


class _Dispatcher(Protocol):
    @property
    def counters(self) -> _DispatchCounters: ...


class CountingApp(Protocol):
    """The ingress application's counters (``IngressApp``)."""

    @property
    def counters(self) -> Mapping[tuple[str, str], int]:
        """Requests by (source, outcome)."""
        ...

    @property
    def dispatcher(self) -> _Dispatcher | None:
        """The fast produce path, once started."""
        ...


class IngressSource:
    """Copies the ingress's hot-path counters into the Prometheus counters."""

    name = "ingress"

    def __init__(self, app: CountingApp, metrics: IngressMetrics) -> None:
        """Read ``app``'s counters and write into ``metrics``."""
        self._app = app
        self._metrics = metrics

    async def refresh(self) -> None:
        """Add what the counters gained since the previous refresh."""
        dispatcher = self._app.dispatcher
        counters = dispatcher.counters if dispatcher is not None else None
        self._metrics.sync(
            dict(self._app.counters),
            produced=counters.produced if counters else 0,
            failed=counters.failed if counters else 0,
            overflowed=counters.overflowed if counters else 0,
        )
