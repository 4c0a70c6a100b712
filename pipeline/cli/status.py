"""What ``pipeline status`` reports: one record per (lane, group), plus the ingress log.

:func:`collect_status` reads the broker through the same probe as the ``/metrics`` refresher
(:func:`~pipeline.observability.lanes.probe_lane`), the log store when one is given, and the
throttled tenants through :class:`ThrottleView` when the admission stage provides one.
:meth:`Status.to_json` is the ``--json`` form, stable for scripts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipeline.errors import PipelineError
from pipeline.logstore import ReplayLog, RowState, Selection
from pipeline.observability.lanes import LaneReport, LaneWatch, probe_lane, retained_dead_letters
from pipeline.transport.protocol import Admin

__all__ = ["LaneStatus", "LogStatus", "Status", "ThrottleView", "collect_status"]


class ThrottleView(Protocol):
    """The admission stage's view of who is throttled (provided by the throttle package)."""

    async def throttled_tenants(self, lane: str, limit: int) -> Sequence[tuple[str, int]]:
        """Up to ``limit`` (tenant, waiting messages) pairs, most waiting first."""
        ...


@dataclass(frozen=True, slots=True)
class LaneStatus:
    """One (lane, group) line of the status screen.

    Attributes:
        report: lag, oldest age, retry-tier depths and dead letters.
        throttled: the most throttled tenants, with their waiting messages.
        error: why the lane could not be read, or "".
        long_work: the lane runs long work (``heartbeat_timeout``): its oldest uncommitted
            message is usually one still running, not one waiting.
        no_group: the broker has no such group: its lag would count every message held, so
            none is shown (:mod:`pipeline.cli.status_groups`).
        readers: with ``no_group``, the groups that read the lane; None when the broker did
            not tell.
    """

    report: LaneReport
    throttled: tuple[tuple[str, int], ...] = ()
    error: str = ""
    long_work: bool = False
    no_group: bool = False
    readers: tuple[str, ...] | None = None

    def no_group_line(self) -> str:
        """What to read instead of the lag of a group that does not exist: who reads the lane."""
        group = self.report.group
        if self.readers is None:
            who = "the broker did not say which groups read it"
        elif self.readers:
            who = f"groups reading it: {', '.join(self.readers)}"
        else:
            who = "no group reads it yet"
        return f"no consumer group {group!r} exists ({who}); name the lane's with --group"


@dataclass(frozen=True, slots=True)
class LogStatus:
    """The ingress log: rows per state, and the oldest waiting ones.

    Attributes:
        rows: row count per state.
        oldest_unproduced_age_s: age of the oldest row not yet produced (0.0: none).
        oldest_unprocessed_age_s: age of the oldest produced row not processed (0.0: none).
    """

    rows: Mapping[str, int]
    oldest_unproduced_age_s: float
    oldest_unprocessed_age_s: float

    @property
    def abandoned(self) -> int:
        """Rows the sweeper gave up on."""
        return self.rows.get(RowState.ABANDONED.value, 0)


@dataclass(frozen=True, slots=True)
class Status:
    """Everything ``pipeline status`` shows."""

    transport: str
    lanes: tuple[LaneStatus, ...]
    log: LogStatus | None = None
    log_error: str = ""
    taken_at_s: float = field(default_factory=time.time)
    throttle_error: str = ""
    cancellations: Mapping[str, Mapping[str, int]] | None = None
    """Lane -> cancelled and hung counts (:mod:`pipeline.cancel.status`); None: unreadable."""
    cancellations_error: str = ""
    """Why the cancelled and hung counts could not be read, or ""."""

    @property
    def healthy(self) -> bool:
        """Every part could be read and every declared topic exists (else status exits 1).

        A lane whose topics are missing shows lag 0 with nothing to read it from: a script
        reading the exit code must not take that for a lane that is caught up.
        """
        return not (
            self.log_error
            or self.throttle_error
            or self.cancellations_error
            or any(lane.error or lane.report.missing_topics for lane in self.lanes)
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready document (seconds as floats, counts as ints)."""
        return {
            "transport": self.transport,
            "taken_at_s": round(self.taken_at_s, 3),
            "lanes": [
                {
                    "lane": lane.report.lane,
                    "group": lane.report.group,
                    # no figures for a group that does not exist: they would count every message
                    "lag": None if lane.no_group else lane.report.lag,
                    "oldest_age_s": None if lane.no_group else round(lane.report.oldest_age_s, 3),
                    "retry_tiers": None if lane.no_group else dict(lane.report.retry_tiers),
                    "group_exists": not lane.no_group,
                    "groups_reading": None if lane.readers is None else list(lane.readers),
                    "dead_letters": lane.report.dead_letters,
                    "throttled_tenants": [
                        {"tenant": tenant, "waiting": waiting} for tenant, waiting in lane.throttled
                    ],
                    "missing_topics": list(lane.report.missing_topics),
                    "error": lane.error or None,
                    "long_work": lane.long_work,
                }
                for lane in self.lanes
            ],
            "log": None
            if self.log is None
            else {
                "rows": dict(self.log.rows),
                "abandoned": self.log.abandoned,
                "oldest_unproduced_age_s": round(self.log.oldest_unproduced_age_s, 3),
                "oldest_unprocessed_age_s": round(self.log.oldest_unprocessed_age_s, 3),
            },
            "log_error": self.log_error or None,
            "throttle_error": self.throttle_error or None,
            "cancellations": None if self.cancellations is None else dict(self.cancellations),
            "cancellations_error": self.cancellations_error or None,
        }


async def collect_status(
    transport_name: str,
    admin: Admin,
    watches: Sequence[LaneWatch],
    *,
    store: ReplayLog | None = None,
    throttles: ThrottleView | None = None,
    top_tenants: int = 5,
    clock: Callable[[], float] = time.time,
) -> Status:
    """Read every watched (lane, group) and, when given, the log store and throttles.

    A lane that cannot be read carries the error instead of failing the whole report.
    """
    try:
        retained = await retained_dead_letters(admin, watches)
    except PipelineError:
        retained = {}
    lanes = []
    for watch in watches:
        try:
            report = await probe_lane(admin, watch, retained, clock=clock)
            error = ""
        except PipelineError as exc:
            report = LaneReport(watch.lane, watch.group, 0, 0.0, {}, 0)
            error = str(exc)
        throttled: tuple[tuple[str, int], ...] = ()
        if throttles is not None:
            throttled = tuple(await throttles.throttled_tenants(watch.lane, top_tenants))
        lanes.append(LaneStatus(report, throttled=throttled, error=error))
    log, log_error = None, ""
    if store is not None:
        try:
            log = await _log_status(store, clock)
        except PipelineError as exc:
            log_error = str(exc)
    return Status(transport_name, tuple(lanes), log, log_error, clock())


async def _log_status(store: ReplayLog, clock: Callable[[], float]) -> LogStatus:
    now_ms = int(clock() * 1000)
    counts = await store.count_by_state(Selection())
    ages = []
    for state in (RowState.RECEIVED, RowState.PRODUCED):
        rows = await store.select(Selection(states=(state,)), limit=1)
        ages.append(max(0.0, (now_ms - rows[0].received_at_ms) / 1000) if rows else 0.0)
    return LogStatus({state.value: count for state, count in counts.items()}, ages[0], ages[1])
