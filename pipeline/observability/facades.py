"""Small typed facades the stages call; each writes the families of one stage.

The runtime, admission, the debouncer, the ingress and the sweeper never import
``prometheus_client``: they are handed one of these (or None to record nothing). Every method is
cheap (a dictionary lookup and an add under a lock held by prometheus-client), safe to call from
the event loop, and never raises for a label value it has not seen before. Label values must come
from bounded sets (lane, tier, outcome, reason, source names), never from keys or tenants; the
one exception, :meth:`AdmissionMetrics.throttled_tenants`, keeps only the top
:data:`~pipeline.observability.metrics.TOP_TENANTS` per lane.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping

from pipeline.admission.keys import org_name
from pipeline.observability import metrics as m
from pipeline.observability.metrics import TOP_TENANTS, Metrics

__all__ = [
    "AdmissionMetrics",
    "CapacityMetrics",
    "DebounceMetrics",
    "HeldReleaseMetrics",
    "IngressMetrics",
    "LagMetrics",
    "LogCommitMetrics",
    "LogStoreMetrics",
    "OffloadMetrics",
    "RuntimeMetrics",
    "SweeperMetrics",
]


class RuntimeMetrics:
    """What one consumer-group member reports about the messages it delivers."""

    def __init__(self, metrics: Metrics) -> None:
        """Write into ``metrics``."""
        self._deliveries = metrics.deliveries
        self._retries = metrics.counter(m.RETRIES)
        self._retry_lateness = metrics.histogram(m.RETRY_LATENESS)
        self._dead = metrics.counter(m.DEAD_LETTERS)
        self._expired = metrics.counter(m.EXPIRED)
        self._parked = metrics.gauge(m.PARKED_KEYS)
        self._busy = metrics.gauge(m.SLOTS_BUSY)
        self._total = metrics.gauge(m.SLOTS_TOTAL)
        self._utilisation = metrics.gauge(m.SLOT_UTILISATION)
        self._batch_waiting = metrics.gauge(m.BATCH_WAITING)
        self._batch_sla = metrics.gauge(m.BATCH_SLA)
        self._long_work_timeout = metrics.gauge(m.LONG_WORK_TIMEOUT)
        self._cancelled = metrics.counter(m.CANCELLED)
        self._hung = metrics.counter(m.HUNG)
        self._long_work = metrics.gauge(m.LONG_WORK)
        self._finished_uncommitted = metrics.gauge(m.FINISHED_UNCOMMITTED)
        self.offload = OffloadMetrics(metrics)
        """The member's payload-store reads (offloaded payloads), in the same registry."""

    def delivered(self, lane: str, outcome: str, duration_s: float) -> None:
        """A handler finished one message with ``outcome`` after ``duration_s`` seconds.

        ``outcome`` is one of handled, skipped, retried, dead_lettered, expired, shed,
        duplicate, cancelled.
        """
        self._deliveries.add((lane, outcome), duration_s)

    def retried(self, lane: str, tier: str) -> None:
        """A message went to the retry tier ``tier`` (its delay label: ``5s``, ``1m``)."""
        self._retries.labels(lane, tier).inc()

    def retry_started(self, lane: str, lateness_s: float) -> None:
        """A retry-tier copy's handler started ``lateness_s`` after the copy's due time."""
        self._retry_lateness.labels(lane).observe(max(0.0, lateness_s))

    def dead_lettered(
        self,
        lane: str,
        reason: str,
        error: BaseException | None = None,  # noqa: ARG002 - for the facades that say it
    ) -> None:
        """A message went to the dead-letter topic; ``reason`` is its ``pl-dead-reason``.

        ``error``, what ended it when it is known, is not a label (it is said by
        :class:`~pipeline.runtime.progress.DeadLetterWarnings`).
        """
        self._dead.labels(lane, reason).inc()

    def expired(self, lane: str) -> None:
        """A message was dropped because its deadline had passed."""
        self._expired.labels(lane).inc()

    def cancelled(self, lane: str, reason: str) -> None:
        """A message was skipped or stopped because its work was cancelled for ``reason``."""
        self._cancelled.labels(lane, reason).inc()

    def hung(self, lane: str) -> None:
        """A run fell silent past its lane's heartbeat timeout and was stopped."""
        self._hung.labels(lane).inc()

    def long_work(self, running: int) -> None:
        """``running`` runs of long-work lanes protect this member from scale-in."""
        self._long_work.set(running)

    def finished_uncommitted(self, lane: str, group: str, count: int) -> None:
        """``count`` messages of ``lane`` are finished but behind a lower offset not yet done.

        They are in ``group``'s lag, which PipelineLagGrowing reads per lane and group.
        """
        self._finished_uncommitted.labels(lane, group).set(count)

    def parked_keys(self, lane: str, count: int) -> None:
        """``count`` keys of ``lane`` are parked behind a message in a retry tier now."""
        self._parked.labels(lane).set(count)

    def batch_lane(self, lane: str, sla_s: float, waiting: int) -> None:
        """A batch lane's SLA, and how many of its messages wait for idle capacity."""
        self._batch_sla.labels(lane).set(sla_s)
        self._batch_waiting.labels(lane).set(waiting)

    def long_work_lane(self, lane: str, heartbeat_timeout_s: float) -> None:
        """``lane`` is a lane of long work with this heartbeat timeout."""
        self._long_work_timeout.labels(lane).set(heartbeat_timeout_s)

    def slots(self, busy: int, total: int) -> None:
        """``busy`` of the member's ``total`` handler slots are in use."""
        self._busy.set(busy)
        self._total.set(total)
        self._utilisation.set(busy / total if total > 0 else 0.0)


class AdmissionMetrics:
    """Throttle state of one member."""

    def __init__(self, metrics: Metrics) -> None:
        """Write into ``metrics``."""
        self._waiting = metrics.gauge(m.THROTTLE_WAITING)
        self._grants = metrics.counter(m.THROTTLE_GRANTS)
        self._fail_open = metrics.counter(m.THROTTLE_FAIL_OPEN)
        self._tenants = metrics.gauge(m.THROTTLED_TENANTS)
        self._shown: dict[str, set[str]] = {}
        self._names: dict[str, str] = {}  # the label of each tenant waiting at the last call

    def waiting(self, lane: str, count: int) -> None:
        """``count`` messages of ``lane`` wait for a throttle slot now."""
        self._waiting.labels(lane).set(count)

    def granted(self, lane: str, count: int = 1) -> None:
        """``count`` throttle slots were granted on ``lane``."""
        self._grants.labels(lane).inc(count)

    def failed_open(self, lane: str, count: int = 1) -> None:
        """Redis failed and ``count`` admissions were let through without a decision."""
        self._fail_open.labels(lane).inc(count)

    def throttled_tenants(self, lane: str, waiting_by_tenant: Mapping[str, int]) -> None:
        """Export the :data:`TOP_TENANTS` tenants with the most waiting messages on ``lane``.

        Tenants that left the top are removed, so the series per lane stay bounded. A tenant is
        a producer's ``pl-tenant`` header, labelled by :func:`~pipeline.admission.keys.org_name`:
        what follows ``org:`` in its throttle key, the name ``pipeline status`` lists and
        ``pipeline throttle status`` prints after ``org:`` (one whose key is over a Redis key
        part's bound by its head and the key's digest, at most 312 bytes; a lone surrogate as
        U+FFFD, so the exposition stays UTF-8). Tenants of one name are one throttle key: their
        waiting messages are one series. The names of the tenants waiting are remembered until
        the next call: one may cost a digest of a long header, and the same tenants wait tick
        after tick.
        """
        known, names = self._names, {}
        named: Counter[str] = Counter()
        for tenant, count in waiting_by_tenant.items():
            if count > 0:
                name = known.get(tenant)
                if name is None:
                    name = org_name(tenant)
                names[tenant] = name
                named[name] += count
        self._names = names  # only those waiting now: a tenant's text is held as long as it waits
        top = dict(sorted(named.items(), key=lambda item: (-item[1], item[0]))[:TOP_TENANTS])
        for gone in self._shown.get(lane, set()) - top.keys():
            self._tenants.remove(lane, gone)
        for tenant, count in top.items():
            self._tenants.labels(lane, tenant).set(count)
        self._shown[lane] = set(top)


class DebounceMetrics:
    """What the debouncer did."""

    def __init__(self, metrics: Metrics) -> None:
        """Write into ``metrics``."""
        self._turns = metrics.counter(m.DEBOUNCE_TURNS)
        self._superseded = metrics.counter(m.DEBOUNCE_SUPERSEDED)
        self._messages = metrics.histogram(m.DEBOUNCE_TURN_MESSAGES)
        self._lateness = metrics.histogram(m.DEBOUNCE_LATENESS)
        self._overdue = metrics.gauge(m.DEBOUNCE_OVERDUE)

    def turn(self, lane: str, messages: int, lateness_s: float) -> None:
        """A turn ran with ``messages`` messages, ``lateness_s`` after its scheduled time."""
        self._turns.labels(lane).inc()
        self._messages.labels(lane).observe(messages)
        self._lateness.labels(lane).observe(max(0.0, lateness_s))

    def superseded(self, lane: str) -> None:
        """A scheduled turn found a newer message and did nothing."""
        self._superseded.labels(lane).inc()

    def overdue(self, lane: str, overdue_s: float) -> None:
        """The earliest turn waiting in ``lane``'s buffers has been due ``overdue_s`` (0: none)."""
        self._overdue.labels(lane).set(overdue_s)


class HeldReleaseMetrics:
    """How long each ordered lane's held followers have waited past their release's lease."""

    def __init__(self, metrics: Metrics) -> None:
        """Write into ``metrics``."""
        self._overdue = metrics.gauge(m.HELD_RELEASE_OVERDUE)

    def overdue(self, lane: str, overdue_s: float) -> None:
        """``lane``'s oldest release has been past its lease ``overdue_s`` (0: none)."""
        self._overdue.labels(lane).set(overdue_s)


class IngressMetrics:
    """Ingress outcomes, fed from the ingress's own counters at each snapshot refresh.

    The ingress keeps plain counters on its hot path (``IngressApp.counters``,
    ``Dispatcher.counters``); :meth:`sync` adds what changed since the last call, so a request
    costs no Prometheus call at all.
    """

    def __init__(self, metrics: Metrics) -> None:
        """Write into ``metrics``."""
        self._requests = metrics.counter(m.INGRESS_REQUESTS)
        self._produced = metrics.counter(m.INGRESS_PRODUCED)
        self._failed = metrics.counter(m.INGRESS_PRODUCE_FAILED)
        self._overflowed = metrics.counter(m.INGRESS_OVERFLOWED)
        self._seen: dict[object, int] = {}

    def request(self, source: str, outcome: str, count: int = 1) -> None:
        """``count`` requests of ``source`` ended with ``outcome`` (``rejected:<reason>`` too)."""
        kind, _, reason = outcome.partition(":")
        self._requests.labels(source, kind, reason).inc(count)

    def sync(
        self,
        requests: Mapping[tuple[str, str], int],
        *,
        produced: int = 0,
        failed: int = 0,
        overflowed: int = 0,
    ) -> None:
        """Add the growth of the ingress's cumulative counters since the previous call."""
        for (source, outcome), total in requests.items():
            delta = self._delta(("request", source, outcome), total)
            if delta:
                self.request(source, outcome, delta)
        self._produced.inc(self._delta("produced", produced))
        self._failed.inc(self._delta("failed", failed))
        self._overflowed.inc(self._delta("overflowed", overflowed))

    def _delta(self, name: object, total: int) -> int:
        previous = self._seen.get(name, 0)
        self._seen[name] = total
        return total - previous if total >= previous else total  # a restarted source


class LogStoreMetrics:
    """Ages and abandoned rows of the ingress log (set by the snapshot refresher)."""

    def __init__(self, metrics: Metrics) -> None:
        """Write into ``metrics``."""
        self._unproduced = metrics.gauge(m.LOG_UNPRODUCED_AGE)
        self._unprocessed = metrics.gauge(m.LOG_UNPROCESSED_AGE)
        self._abandoned = metrics.gauge(m.LOG_ABANDONED)

    def observe(self, *, unproduced_age_s: float, unprocessed_age_s: float, abandoned: int) -> None:
        """The oldest unproduced and unprocessed rows' ages (0: none) and the abandoned count."""
        self._unproduced.set(unproduced_age_s)
        self._unprocessed.set(unprocessed_age_s)
        self._abandoned.set(abandoned)


class LogCommitMetrics:
    """The ingress log's group commits: how long each took and how many rows it carried."""

    def __init__(self, metrics: Metrics) -> None:
        """Write into ``metrics``."""
        self._seconds = metrics.histogram(m.LOG_COMMIT_DURATION)
        self._rows = metrics.histogram(m.LOG_COMMIT_ROWS)

    def committed(self, rows: int, seconds: float) -> None:
        """One group commit of ``rows`` rows took ``seconds`` (a log store's commit observer)."""
        self._seconds.observe(seconds)
        self._rows.observe(rows)


class SweeperMetrics:
    """The sweeper's heartbeat and what it did; a silent sweeper is an alert."""

    def __init__(self, metrics: Metrics, clock: Callable[[], float] = time.time) -> None:
        """Write into ``metrics``; ``clock`` gives Unix time in seconds."""
        self._last_run = metrics.gauge(m.SWEEPER_LAST_RUN)
        self._rows = metrics.counter(m.SWEEPER_ROWS)
        self._clock = clock

    def swept(
        self, *, produced: int, replayed: int, abandoned: int, failed: int, finished: bool = True
    ) -> None:
        """A sweep acted on these rows; only a ``finished`` one (it did not raise) stamps its run.

        A sweep that keeps failing (its log store gone) so leaves the last-run time behind, and
        the sweeper's staleness alert fires, while the rows it did act on are still counted.
        """
        for action, count in (
            ("produced", produced),
            ("replayed", replayed),
            ("abandoned", abandoned),
            ("failed", failed),
        ):
            self._rows.labels(action).inc(count)
        if finished:
            self._last_run.set(self._clock())


class LagMetrics:
    """Lag, age, retry-tier and dead-letter depths (set by the group-lag collector)."""

    def __init__(self, metrics: Metrics) -> None:
        """Write into ``metrics``."""
        self._age = metrics.gauge(m.OLDEST_AGE)
        self._lag = metrics.gauge(m.LAG)
        self._tier = metrics.gauge(m.RETRY_DEPTH)
        self._overdue = metrics.gauge(m.RETRY_OVERDUE)
        self._dlq = metrics.gauge(m.DLQ_DEPTH)

    def lane(self, lane: str, group: str, *, lag: int, oldest_age_s: float) -> None:
        """The group's lag and oldest waiting message's age on the lane's main topics."""
        self._lag.labels(lane, group).set(lag)
        self._age.labels(lane, group).set(oldest_age_s)

    def retry_tier(
        self, lane: str, group: str, tier: str, depth: int, overdue_s: float = 0.0
    ) -> None:
        """Messages waiting in retry tier ``tier`` of ``lane`` for ``group``.

        ``overdue_s`` is how long past the tier's delay the oldest of them has waited (0.0:
        none past it).
        """
        self._tier.labels(lane, group, tier).set(depth)
        self._overdue.labels(lane, group, tier).set(overdue_s)

    def dead_letters(self, lane: str, count: int) -> None:
        """Messages retained in the lane's dead-letter topic."""
        self._dlq.labels(lane).set(count)


class RetentionLossMetrics:
    """Messages lost to retention, fed from the transport's per-process tally at each refresh."""

    def __init__(self, metrics: Metrics) -> None:
        """Write into ``metrics``."""
        self._lost = metrics.counter(m.LOST_TO_RETENTION)
        self._seen: dict[tuple[str, str], int] = {}

    def sync(self, lost: Mapping[tuple[str, str], int]) -> None:
        """Add the growth of the cumulative (topic, group) counts since the previous call."""
        for (topic, group), total in lost.items():
            delta = total - self._seen.get((topic, group), 0)
            self._seen[(topic, group)] = total
            if delta > 0:
                self._lost.labels(topic, group).inc(delta)


class CapacityMetrics:
    """The forecast and desired member count of each lane (the capacity planner's gauges)."""

    def __init__(self, metrics: Metrics) -> None:
        """Write into ``metrics``."""
        self._forecast = metrics.gauge(m.FORECAST_ARRIVALS)
        self._desired = metrics.gauge(m.DESIRED_MEMBERS)
        self._service = metrics.gauge(m.SERVICE_TIME)

    def planned(
        self, lane: str, forecast_per_s: float, desired_members: int, service_s: float
    ) -> None:
        """``lane``: its forecast rate, the members it needs, its service time in seconds."""
        self._forecast.labels(lane).set(forecast_per_s)
        self._desired.labels(lane).set(desired_members)
        self._service.labels(lane).set(service_s)


class OffloadMetrics:
    """Objects written to, reused in, read from, missing from and purged from payload stores.

    An :class:`~pipeline.offload.observer.OffloadObserver`: called once per large payload (never
    per message of a lane that does not offload), labelled by the store's URL.
    """

    def __init__(self, metrics: Metrics) -> None:
        """Write into ``metrics``."""
        self._objects = metrics.counter(m.OFFLOAD_OBJECTS)
        self._written = metrics.counter(m.OFFLOAD_WRITTEN_BYTES)
        self._fetched = metrics.counter(m.OFFLOAD_FETCHED_BYTES)
        self._fetch_s = metrics.histogram(m.OFFLOAD_FETCH_DURATION)
        self._missing = metrics.counter(m.OFFLOAD_MISSING)
        self._purged = metrics.counter(m.OFFLOAD_PURGED)

    def written(self, store: str, size: int) -> None:
        """A payload of ``size`` bytes was written to ``store`` (new, or written again)."""
        self._objects.labels(store, "written").inc()
        self._written.labels(store).inc(size)

    def reused(self, store: str) -> None:
        """A payload was already in ``store``: nothing was written."""
        self._objects.labels(store, "reused").inc()

    def fetched(self, store: str, size: int, duration_s: float) -> None:
        """A payload of ``size`` bytes was read whole from ``store`` in ``duration_s``."""
        self._fetched.labels(store).inc(size)
        self._fetch_s.labels(store).observe(duration_s)

    def missing(self, store: str) -> None:
        """A reference's object was not in ``store``."""
        self._missing.labels(store).inc()

    def purged(self, store: str, objects: int) -> None:
        """A purge deleted ``objects`` objects from ``store``."""
        self._purged.labels(store).inc(objects)
