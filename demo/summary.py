"""What a run amounts to: one :class:`Snapshot` the dashboard draws and the summary saves.

The loss check follows property P1: every accepted webhook is handled, dead-lettered or still
waiting (in a retry tier, or in its main topic when the drain time ran out), so
``lost = accepted - handled - dead_lettered - in_retry - waiting - handled_not_marked`` must be
0; the last term counts events a handler finished (say the observations) whose log row was never
marked processed. ``handled`` and ``dead_lettered`` come from the pipeline itself (log rows
marked processed, dead-letter topic counts), not from the observations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from demo.audit import Audit
from demo.stats import Collector
from pipeline.logstore import RowState


@dataclass
class Snapshot:
    """The state of a run at one moment.

    Attributes:
        transport: ``redis`` or ``kafka``.
        elapsed_s: seconds since the traffic started.
        duration_s: planned length of the traffic.
        phase: ``starting``, ``traffic``, ``draining`` or ``done``.
        traffic: the generator's counts (sent, accepted, shed, ...; by_kind).
        rows: ingress log rows per state.
        dead_lettered: messages in the dead-letter topics during this run.
        retried: messages routed to retry tiers during this run (retries, and messages
            parked behind an earlier message of their key).
        in_retry: the groups' lag on their retry topics (an estimate until the audit).
        main_backlog: the groups' lag on their main topics.
        audit: where the unfinished events are, read from the topics at the end (:mod:`.audit`).
        collector: the folded observations.
        interrupted: the run was stopped by Ctrl-C or SIGTERM.
    """

    transport: str
    elapsed_s: float
    duration_s: float
    phase: str
    traffic: dict[str, Any]
    rows: dict[RowState, int]
    dead_lettered: int
    retried: int
    in_retry: int
    collector: Collector
    interrupted: bool = False
    main_backlog: int = 0
    audit: Audit | None = None
    accepted_series: list[tuple[float, int]] = field(default_factory=list)
    offloaded: int | None = None
    """Objects the run's large bodies became in S3Proxy (None: S3Proxy was not running)."""
    offload_store: str | None = None
    """Where they went (``s3://pipeline/demo-<run>``, emptied at the end), None without S3Proxy."""

    @property
    def accepted(self) -> int:
        """Webhooks the ingress answered 200 accepted (duplicates excluded)."""
        return int(self.traffic.get("accepted", 0))

    @property
    def processed(self) -> int:
        """Log rows whose events are finished: handled or dead-lettered."""
        return self.rows.get(RowState.PROCESSED, 0)

    @property
    def handled(self) -> int:
        """Events handled (finished and not dead-lettered)."""
        return max(0, self.processed - self.dead_lettered)

    @property
    def unfinished(self) -> int:
        """Accepted events neither handled nor dead-lettered yet."""
        return self.accepted - self.handled - self.dead_lettered

    @property
    def waiting_retry(self) -> int:
        """Events waiting to be tried again: in retry tiers or in a debounced turn's retry."""
        in_topics = self.audit.in_retry if self.audit is not None else self.in_retry
        return in_topics + self.collector.turn_messages_in_retry

    @property
    def waiting(self) -> int:
        """Events not yet consumed from their main topic (e.g. held back by a throttle)."""
        return self.audit.waiting if self.audit is not None else self.main_backlog

    @property
    def unmarked(self) -> int:
        """Events a handler finished whose log row is not marked processed (from the audit)."""
        return self.audit.unmarked if self.audit is not None else 0

    @property
    def lost(self) -> int:
        """Unfinished events that are nowhere: not in a retry tier, a main topic or a handler."""
        return self.unfinished - self.waiting_retry - self.waiting - self.unmarked


def summary(snapshot: Snapshot) -> dict[str, Any]:
    """The JSON summary of a run (``demo-output/summary.json``)."""
    c = snapshot.collector
    flooder = c.flooder()
    by_kind = snapshot.traffic.get("by_kind", {})
    # Without an audit that read every topic to its end, the remainder is not a count of lost
    # events (an interrupted run stops mid-flight): it is reported as unknown, not as a number.
    audited = snapshot.audit is not None and snapshot.audit.complete
    return {
        "transport": snapshot.transport,
        "duration_s": snapshot.duration_s,
        "interrupted": snapshot.interrupted,
        "sent": snapshot.traffic.get("sent", 0),
        "accepted": snapshot.accepted,
        "duplicates": snapshot.traffic.get("duplicate", 0),
        "shed_503": snapshot.traffic.get("shed", 0),
        "rejected": snapshot.traffic.get("rejected", 0),
        "failed_to_send": snapshot.traffic.get("failed", 0),
        "log_rows": {str(state): n for state, n in sorted(snapshot.rows.items())},
        "handled": snapshot.handled,
        "dead_lettered": snapshot.dead_lettered,
        "in_retry": snapshot.waiting_retry,
        "waiting": snapshot.waiting,
        "handled_not_marked": snapshot.unmarked,
        "lost": snapshot.lost if audited else None,
        "audit_complete": audited,
        "routed_to_retry": snapshot.retried,
        "handler_calls": dict(c.outcomes),
        "small_tenant_p50_wait_ms": c.small.p(0.5),
        "small_tenant_p99_wait_ms": c.small.p(0.99),
        "flooder_p50_wait_ms": flooder.p(0.5),
        "flooder_p99_wait_ms": flooder.p(0.99),
        "ai_messages_accepted": by_kind.get("ai", 0),
        "turns": c.turns,
        "messages_per_turn": round(c.messages_per_turn, 2) if c.messages_per_turn else None,
        "turn_p50_wait_ms": c.turn_waits.p(0.5),
        "turn_p99_wait_ms": c.turn_waits.p(0.99),
        "large_bodies_accepted": snapshot.traffic.get("large", 0),
        "offloaded_objects": snapshot.offloaded,
        "offload_store": snapshot.offload_store,
    }


def write_summary(snapshot: Snapshot, path: Path) -> dict[str, Any]:
    """Write the summary as JSON to ``path`` and return it."""
    data = summary(snapshot)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return data


def _fmt(name: str, value: object) -> str:
    if value is None:
        if name == "offloaded_objects":
            return "off (inline: S3Proxy not running)"
        return "unknown (audit incomplete)" if name == "lost" else "-"
    return f"{value:,}" if isinstance(value, int) else str(value)


def summary_table(data: dict[str, Any]) -> Table:
    """The summary as a two-column table for the terminal."""
    title = "demo summary (interrupted: Ctrl-C or SIGTERM)" if data["interrupted"] else None
    table = Table("measure", "value", title=title or "demo summary")
    for name in (
        "accepted",
        "handled",
        "dead_lettered",
        "in_retry",
        "waiting",
        "handled_not_marked",
        "lost",
        "routed_to_retry",
        "shed_503",
        "small_tenant_p50_wait_ms",
        "small_tenant_p99_wait_ms",
        "flooder_p50_wait_ms",
        "flooder_p99_wait_ms",
        "ai_messages_accepted",
        "turns",
        "messages_per_turn",
        "turn_p99_wait_ms",
        "large_bodies_accepted",
        "offloaded_objects",
    ):
        style = "bold red" if name == "lost" and data[name] else None
        table.add_row(name, _fmt(name, data[name]), style=style)
    return table


def lost_line(data: dict[str, Any], output: Path) -> str | None:
    """The error line for a run that lost accepted events (None when ``lost`` is 0 or unknown).

    ``data`` is the summary, ``output`` the run's output directory (summary, log store, logs).
    """
    lost = data.get("lost")
    if not lost:
        return None
    return (
        f"error: lost {lost} accepted webhook(s) (property P1): not handled, dead-lettered,"
        " waiting in a main topic or a retry tier, held behind a parked key nor in a retrying"
        " turn; they are among the log rows not marked processed (state received or produced)"
        f" in {output / 'ingress.db'}; the consumers' logs are in {output / 'logs'}, the counts"
        f" in {output / 'summary.json'} (docs/demo.md, Output)"
    )
