"""Every Prometheus metric family of the pipeline, defined once, in a registry per process.

:data:`FAMILIES` is the single list of names, types, labels and units; ``docs/glossary.md``
and ``deploy/prometheus/alerts.yaml`` are checked against it by the tests. :class:`Metrics`
instantiates all of them in its own :class:`~prometheus_client.CollectorRegistry` (never the
global default registry), so a process, or a test, can hold several independent sets.

Conventions: base units (seconds, messages, rows) with Prometheus suffixes (``_seconds``,
``_total``, ``_ratio``); labels are bounded (lane, group, tier, outcome, reason, source,
action); a tenant appears only in :data:`THROTTLED_TENANTS`, which keeps at most
:data:`TOP_TENANTS` series per lane. The stages never touch these objects directly; they call
the small facades in :mod:`pipeline.observability.facades`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = [
    "FAMILIES",
    "TOP_TENANTS",
    "Family",
    "Kind",
    "Metrics",
    "family",
]

Kind = Literal["counter", "gauge", "histogram"]
TOP_TENANTS = 10
"""Most tenants per lane exported by :data:`THROTTLED_TENANTS` (bounded cardinality)."""

DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
LATENESS_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
RETRY_LATENESS_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TURN_MESSAGES_BUCKETS = (1, 2, 3, 5, 8, 13, 21, 34, 55, 100)
COMMIT_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
COMMIT_ROWS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 512)


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as exposed to Prometheus.

    Attributes:
        name: the exposed name (counters end in ``_total``).
        kind: counter, gauge or histogram.
        help: the HELP text: what one sample means.
        labels: label names, each with a bounded set of values.
        unit: the base unit of a sample (``seconds``, ``messages``, ``rows``, ``ratio``, ...).
        buckets: histogram bucket upper bounds (histograms only).
    """

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""
    buckets: tuple[float, ...] = ()

    def exposed_names(self) -> tuple[str, ...]:
        """The sample names a scrape shows for this family (histograms add three)."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


LG = ("lane", "group")

# -- the consumer runtime ---------------------------------------------------------------------
DELIVERIES = Family(
    "pipeline_deliveries_total",
    "counter",
    "Messages finished by this member, by outcome (handled, skipped, retried, dead_lettered, "
    "expired, shed, duplicate, deferred, parked, buffered, cancelled, unrouted).",
    ("lane", "outcome"),
    "messages",
)
HANDLER_DURATION = Family(
    "pipeline_handler_duration_seconds",
    "histogram",
    "Time a handler ran for one message, by outcome.",
    ("lane", "outcome"),
    "seconds",
    DURATION_BUCKETS_S,
)
RETRIES = Family(
    "pipeline_retries_total",
    "counter",
    "Messages sent to a retry tier, by tier delay (5s, 1m, ...).",
    ("lane", "tier"),
    "messages",
)
RETRY_LATENESS = Family(
    "pipeline_retry_lateness_seconds",
    "histogram",
    "How long after its due time a retry-tier copy's handler started (a member behind its "
    "backlog, or a retry tier it reads late, shows here).",
    ("lane",),
    "seconds",
    RETRY_LATENESS_BUCKETS_S,
)
DEAD_LETTERS = Family(
    "pipeline_dead_letters_total",
    "counter",
    "Messages sent to the dead-letter topic, by reason (the pl-dead-reason header: fatal, "
    "exhausted, expired, poison, ...).",
    ("lane", "reason"),
    "messages",
)
EXPIRED = Family(
    "pipeline_expired_total",
    "counter",
    "Messages not run because their deadline had passed or a standing queue shed them.",
    ("lane",),
    "messages",
)
CANCELLED = Family(
    "pipeline_cancelled_total",
    "counter",
    "Messages this member did not run, or stopped while running, because their work was "
    "cancelled, by cause (requested: pipeline cancel, app.cancel or a standing cancellation; "
    "abandoned: its pl-abandon-after-ms passed).",
    ("lane", "reason"),
    "messages",
)
HUNG = Family(
    "pipeline_hung_handlers_total",
    "counter",
    "Runs stopped because they were silent past their lane's heartbeat_timeout (then retried "
    "or dead-lettered).",
    ("lane",),
    "runs",
)
LONG_WORK = Family(
    "pipeline_long_work_running",
    "gauge",
    "Runs of long-work lanes (heartbeat_timeout) in this member that count towards its "
    "scale-in protection (its pod-deletion-cost in Kubernetes).",
    (),
    "runs",
)
FINISHED_UNCOMMITTED = Family(
    "pipeline_finished_uncommitted_messages",
    "gauge",
    "Messages of the lane's main topics this member of the group finished above a lower "
    "offset not yet done (a long run): the group's lag counts them until that offset is done; "
    "the slot trigger and PipelineLagGrowing subtract them.",
    ("lane", "group"),
    "messages",
)
PARKED_KEYS = Family(
    "pipeline_parked_keys",
    "gauge",
    "Keys of an ordered lane parked behind a message in a retry tier (the group's, as Redis "
    "holds them at the last refresh).",
    ("lane",),
    "keys",
)
SLOTS_BUSY = Family(
    "pipeline_worker_slots_busy",
    "gauge",
    "Handler slots in use in this member by interactive work: messages running (batch lanes "
    "are left out) and debounced turns running.",
    (),
    "slots",
)
SLOTS_TOTAL = Family(
    "pipeline_worker_slots",
    "gauge",
    "Handler slots of this member: its message slots (max_concurrency, lowered under memory "
    "or CPU pressure; none when all its lanes are debounced) and max_concurrency turn slots "
    "per debounced lane.",
    (),
    "slots",
)
BATCH_WAITING = Family(
    "pipeline_batch_waiting_messages",
    "gauge",
    "Messages of a batch lane this member holds back until it has idle capacity.",
    ("lane",),
    "messages",
)
BATCH_SLA = Family(
    "pipeline_batch_sla_seconds",
    "gauge",
    "The SLA of a batch lane (its batch.sla); interactive lanes have none. Age alerts leave "
    "batch lanes to PipelineBatchNearSla.",
    ("lane",),
    "seconds",
)
LONG_WORK_TIMEOUT = Family(
    "pipeline_long_work_heartbeat_timeout_seconds",
    "gauge",
    "The heartbeat_timeout of a lane of long work; other lanes have none. Its oldest "
    "uncommitted message is usually running, not waiting: age alerts leave such lanes to "
    "PipelineHungHandlers.",
    ("lane",),
    "seconds",
)
SLOT_UTILISATION = Family(
    "pipeline_worker_slot_utilization_ratio",
    "gauge",
    "Busy slots over all slots of this member (0-1); an autoscaling signal.",
    (),
    "ratio",
)
# -- lag and age (the alarm signal), from the transport's group lag --------------------------
OLDEST_AGE = Family(
    "pipeline_oldest_message_age_seconds",
    "gauge",
    "Age of the oldest message the group has not processed yet in the lane's main topics "
    "(0 when caught up).",
    LG,
    "seconds",
)
LAG = Family(
    "pipeline_consumer_lag_messages",
    "gauge",
    "Messages produced to the lane's main topics, not yet committed by the group and still "
    "held (those that expired or were trimmed first are not counted).",
    LG,
    "messages",
)
LOST_TO_RETENTION = Family(
    "pipeline_messages_lost_to_retention_total",
    "counter",
    "Messages of the topic this member found removed by retention (Kafka retention, Redis "
    "MAXLEN trimming) before its group read or finished them; each loss is also one ERROR line.",
    ("topic", "group"),
    "messages",
)
REDIS_STATE_LOST = Family(
    "pipeline_redis_state_lost_total",
    "counter",
    "Times this member found its Redis had lost its data (restarted empty or from an older "
    "snapshot, flushed, or failed over to a replica that lagged): the followers held behind "
    "parked keys and the messages buffered for debounced turns went with it; each is also one "
    "CRITICAL line. Every member using that Redis counts the same loss once.",
    ("group",),
    "losses",
)
RETRY_DEPTH = Family(
    "pipeline_retry_tier_messages",
    "gauge",
    "Messages waiting in one retry tier of the lane for the group.",
    ("lane", "group", "tier"),
    "messages",
)
RETRY_OVERDUE = Family(
    "pipeline_retry_tier_overdue_seconds",
    "gauge",
    "How long past the tier's delay the oldest copy waiting in one retry tier of the lane for "
    "the group has waited (0: none past it): a retry no member runs.",
    ("lane", "group", "tier"),
    "seconds",
)
DLQ_DEPTH = Family(
    "pipeline_dead_letter_messages",
    "gauge",
    "Messages retained in the lane's dead-letter topic.",
    ("lane",),
    "messages",
)
REFRESH_TIMESTAMP = Family(
    "pipeline_metrics_refresh_timestamp_seconds",
    "gauge",
    "When the /metrics snapshot was last refreshed completely (Unix time).",
    (),
    "seconds",
)
REFRESH_ERRORS = Family(
    "pipeline_metrics_refresh_errors_total",
    "counter",
    "Refreshes of a snapshot source that failed or timed out, by source.",
    ("source",),
    "refreshes",
)
# -- admission: throttles and the debouncer --------------------------------------------------
THROTTLE_WAITING = Family(
    "pipeline_throttle_waiting",
    "gauge",
    "Messages of the lane waiting for a throttle slot (this member).",
    ("lane",),
    "messages",
)
THROTTLE_GRANTS = Family(
    "pipeline_throttle_grants_total", "counter", "Throttle slots granted.", ("lane",), "grants"
)
THROTTLE_FAIL_OPEN = Family(
    "pipeline_throttle_fail_open_total",
    "counter",
    "Admissions let through without a throttle decision because Redis failed.",
    ("lane",),
    "admissions",
)
THROTTLED_TENANTS = Family(
    "pipeline_throttled_tenant_waiting",
    "gauge",
    f"Waiting messages of the {TOP_TENANTS} most throttled tenants of the lane.",
    ("lane", "tenant"),
    "messages",
)
DEBOUNCE_TURNS = Family(
    "pipeline_debounce_turns_total", "counter", "Debounced turns that ran.", ("lane",), "turns"
)
DEBOUNCE_SUPERSEDED = Family(
    "pipeline_debounce_superseded_total",
    "counter",
    "Scheduled turns that found a newer message and did nothing.",
    ("lane",),
    "turns",
)
DEBOUNCE_TURN_MESSAGES = Family(
    "pipeline_debounce_turn_messages",
    "histogram",
    "Messages one debounced turn received.",
    ("lane",),
    "messages",
    TURN_MESSAGES_BUCKETS,
)
DEBOUNCE_LATENESS = Family(
    "pipeline_debounce_lateness_seconds",
    "histogram",
    "How long after its scheduled time a turn started.",
    ("lane",),
    "seconds",
    LATENESS_BUCKETS_S,
)
DEBOUNCE_OVERDUE = Family(
    "pipeline_debounce_overdue_seconds",
    "gauge",
    "How long the lane's earliest debounced turn has been due (a running turn: its lease has "
    "run out), by Redis's clock (0: none due): a turn no member runs.",
    ("lane",),
    "seconds",
)
HELD_RELEASE_OVERDUE = Family(
    "pipeline_held_release_overdue_seconds",
    "gauge",
    "How long the lease of the lane's oldest release of held followers (an ordered lane's key "
    "parked behind a retry) has run out, by Redis's clock (0: none): followers no member runs.",
    ("lane",),
    "seconds",
)
# -- ingress ---------------------------------------------------------------------------------
INGRESS_REQUESTS = Family(
    "pipeline_ingress_requests_total",
    "counter",
    "Webhook requests by outcome (accepted, duplicate, rejected, shed, too_large, malformed, "
    "store_error, offload_error, handshake, handshake_refused, body_timeout, body_budget, "
    "disconnected, connection_limit) and reason.",
    ("source", "outcome", "reason"),
    "requests",
)
INGRESS_PRODUCED = Family(
    "pipeline_ingress_produced_total",
    "counter",
    "Accepted webhooks the fast path produced.",
    (),
    "events",
)
INGRESS_PRODUCE_FAILED = Family(
    "pipeline_ingress_produce_failures_total",
    "counter",
    "Accepted webhooks whose fast-path produce failed (the sweeper produces them).",
    (),
    "events",
)
INGRESS_OVERFLOWED = Family(
    "pipeline_ingress_overflowed_total",
    "counter",
    "Accepted webhooks left to the sweeper because the produce queue was full.",
    (),
    "events",
)
# -- the log store and its sweeper -----------------------------------------------------------
LOG_UNPRODUCED_AGE = Family(
    "pipeline_log_oldest_unproduced_age_seconds",
    "gauge",
    "Age of the oldest accepted webhook not yet acknowledged by the broker (0: none).",
    (),
    "seconds",
)
LOG_UNPROCESSED_AGE = Family(
    "pipeline_log_oldest_unprocessed_age_seconds",
    "gauge",
    "Age of the oldest produced webhook no consumer reported processed (0: none).",
    (),
    "seconds",
)
LOG_COMMIT_DURATION = Family(
    "pipeline_log_commit_duration_seconds",
    "histogram",
    "Time one group commit of the ingress log took, the flush to disk included (SQLite FULL, "
    "PostgreSQL): every webhook it carried waited that long for its answer.",
    (),
    "seconds",
    COMMIT_BUCKETS_S,
)
LOG_COMMIT_ROWS = Family(
    "pipeline_log_commit_rows",
    "histogram",
    "Webhook rows one group commit of the ingress log carried.",
    (),
    "rows",
    COMMIT_ROWS_BUCKETS,
)
LOG_ABANDONED = Family(
    "pipeline_log_abandoned_rows",
    "gauge",
    "Log rows the sweeper gave up on (abandoned), still retained.",
    (),
    "rows",
)
SWEEPER_LAST_RUN = Family(
    "pipeline_sweeper_last_run_timestamp_seconds",
    "gauge",
    "When the sweeper last finished a sweep (Unix time).",
    (),
    "seconds",
)
SWEEPER_ROWS = Family(
    "pipeline_sweeper_rows_total",
    "counter",
    "Rows the sweeper acted on, by action (produced, replayed, abandoned, failed).",
    ("action",),
    "rows",
)

# -- offloaded payloads (pipeline/offload): the object store behind large messages ----------
OFFLOAD_OBJECTS = Family(
    "pipeline_offload_objects_total",
    "counter",
    "Large payloads the ingress or a producer sent to a payload store, by outcome (written: a "
    "new object, or one a day old written again before its reference was produced again; "
    "reused: the same content was already stored, nothing written).",
    ("store", "outcome"),
    "objects",
)
OFFLOAD_WRITTEN_BYTES = Family(
    "pipeline_offload_written_bytes_total",
    "counter",
    "Payload bytes written to a payload store (reused objects add nothing).",
    ("store",),
    "bytes",
)
OFFLOAD_FETCHED_BYTES = Family(
    "pipeline_offload_fetched_bytes_total",
    "counter",
    "Payload bytes this member read whole from a payload store, digest checked.",
    ("store",),
    "bytes",
)
OFFLOAD_FETCH_DURATION = Family(
    "pipeline_offload_fetch_duration_seconds",
    "histogram",
    "Time to read one offloaded payload whole, from its first request to its last byte.",
    ("store",),
    "seconds",
    DURATION_BUCKETS_S,
)
OFFLOAD_MISSING = Family(
    "pipeline_offload_missing_total",
    "counter",
    "References whose object was gone from the store (dead-lettered as payload_missing).",
    ("store",),
    "references",
)
OFFLOAD_PURGED = Family(
    "pipeline_offload_purged_total",
    "counter",
    "Objects deleted from a payload store by a purge given an observer (pipeline offload "
    "purge prints its counts instead).",
    ("store",),
    "objects",
)

# -- capacity: the forecast and the members it asks for (pipeline/capacity) -----------------
FORECAST_ARRIVALS = Family(
    "pipeline_forecast_arrivals_per_second",
    "gauge",
    "Arrivals per second the lane is sized for: the busiest forecast minute of the next lead "
    "window (seasonal baseline times the recent trend), or the current rate if higher.",
    ("lane",),
    "messages",
)
DESIRED_MEMBERS = Family(
    "pipeline_desired_members",
    "gauge",
    "Members the lane needs for its forecast peak by Little's law at the target utilisation; "
    "a KEDA trigger with threshold 1.",
    ("lane",),
    "members",
)
SERVICE_TIME = Family(
    "pipeline_service_time_seconds",
    "gauge",
    "Mean handler time of one message of the lane the planner sized it with (measured over the "
    "last hour, else configured); the slot trigger sizes the backlog's members with it.",
    ("lane",),
    "seconds",
)

FAMILIES: tuple[Family, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, Family)
)
"""Every family, in definition order."""


def family(name: str) -> Family:
    """The family called ``name`` (KeyError if there is none)."""
    for item in FAMILIES:
        if item.name == name:
            return item
    raise KeyError(name)


Instrument = Counter | Gauge | Histogram


class Metrics:
    """The families of :data:`FAMILIES` in a registry; :attr:`registry` is what ``/metrics`` serves.

    A labelled family shows no sample until a label set is written; an unlabelled one shows
    one (0) from the moment it is made. So the unlabelled ones are made the first time a facade
    asks for them, and a process shows only those it writes: made with the registry, the
    members' slot utilisation showed as 0 on every ingress pod, averaged into alerts over every
    scraped pod.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """The families go in ``registry`` (default: a new one); unlabelled ones on first use."""
        from pipeline.observability.tally import OutcomeTally  # noqa: PLC0415 - it types Family

        self.registry = registry if registry is not None else CollectorRegistry()
        self.deliveries = OutcomeTally(DELIVERIES, HANDLER_DURATION)
        """Deliveries and their handler durations, counted per message (see its module)."""
        self.registry.register(self.deliveries)
        self._instruments: dict[str, Instrument] = {}
        for item in FAMILIES:
            if item.labels and item not in (DELIVERIES, HANDLER_DURATION):
                self._instruments[item.name] = self._create(item)

    def _instrument(self, item: Family) -> Instrument:
        """``item``'s instrument, made in the registry on first use."""
        instrument = self._instruments.get(item.name)
        if instrument is None:
            if item in (DELIVERIES, HANDLER_DURATION):
                raise TypeError(f"{item.name} is written through Metrics.deliveries")
            instrument = self._instruments[item.name] = self._create(item)
        return instrument

    def _create(self, item: Family) -> Instrument:
        if item.kind == "counter":
            return Counter(item.name, item.help, item.labels, registry=self.registry)
        if item.kind == "gauge":
            return Gauge(item.name, item.help, item.labels, registry=self.registry)
        return Histogram(
            item.name, item.help, item.labels, registry=self.registry, buckets=item.buckets
        )

    def counter(self, item: Family) -> Counter:
        """The counter of ``item``."""
        instrument = self._instrument(item)
        if not isinstance(instrument, Counter):
            raise TypeError(f"{item.name} is a {item.kind}")
        return instrument

    def gauge(self, item: Family) -> Gauge:
        """The gauge of ``item``."""
        instrument = self._instrument(item)
        if not isinstance(instrument, Gauge):
            raise TypeError(f"{item.name} is a {item.kind}")
        return instrument

    def histogram(self, item: Family) -> Histogram:
        """The histogram of ``item``."""
        instrument = self._instrument(item)
        if not isinstance(instrument, Histogram):
            raise TypeError(f"{item.name} is a {item.kind}")
        return instrument
