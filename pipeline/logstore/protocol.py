"""The log row, its states, and the role protocols every log store implements.

Each stage sees only the role it needs: the ingress writes rows (:class:`IngressLog`), the
consumer runtime marks them handled (:class:`ProcessedMarker`), the sweeper claims the ones the
queue lost (:class:`SweepLog`) and the replay CLI selects them (:class:`ReplayLog`).
:class:`LogStore` is all of them plus lifecycle and retention; ``SqliteLogStore`` and
``PostgresLogStore`` implement it and pass one contract suite (``tests/logstore/``).

Guarantees every implementation keeps:

* :meth:`IngressLog.insert` returns only after the row is durable (committed, and on SQLite
  fsynced as ``synchronous`` says); ``(source, event_id)`` is unique, so a redelivery inserts
  nothing and returns False.
* Marking is idempotent and never moves a row backwards: a processed or abandoned row stays so
  when a late produce acknowledgement marks it produced.
* Claims are leases: a claimed row is not returned to another claimer until ``lease_ms`` has
  passed, which keeps two sweepers (several ingress replicas) from producing the same row at once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from pipeline.logstore.batch import Committed


class RowState(StrEnum):
    """Where a row is in its life (see the diagram in :mod:`pipeline.logstore`)."""

    RECEIVED = "received"
    """Committed and answered; not yet acknowledged by the broker."""
    PRODUCED = "produced"
    """The broker acknowledged the event; no consumer has reported it handled yet."""
    PROCESSED = "processed"
    """A consumer handled the event (terminal)."""
    ABANDONED = "abandoned"
    """Replayed too often without being processed, or unproducible (terminal, logged CRITICAL)."""


TERMINAL_STATES = frozenset({RowState.PROCESSED, RowState.ABANDONED})


@dataclass(frozen=True, slots=True)
class NewRow:
    """A verified webhook, as the ingress writes it before answering.

    Attributes:
        id: row id, unique across replicas (time-ordered hex, see ``pipeline.ingress.ids``).
        source: the configured source name (``/hooks/{source}``).
        tenant: the tenant extracted from the request, or "" when the source has none.
        key: the partitioning key of the produced event, or "" for none.
        topic: the topic the event is routed to.
        lane: the admission lane of that topic.
        event_id: the provider's event id; ``(source, event_id)`` is unique.
        received_at_ms: receive time in milliseconds since the epoch.
        headers: the request headers the source keeps (names lower-case).
        body: the raw request body, byte for byte as signed.
    """

    id: str
    source: str
    tenant: str
    key: str
    topic: str
    lane: str
    event_id: str
    received_at_ms: int
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class LogRow:
    """A stored row: the :class:`NewRow` fields plus its delivery bookkeeping.

    Attributes:
        state: where the row is in its life.
        produce_attempts: produce attempts so far (fast path, sweeps and replays), failed or not.
        replay_count: how many times the sweeper produced the row again since its first
            production or its last replay by hand (which starts the count again).
        last_error: the last produce failure or the abandonment reason, or "".
        produced_at_ms: when the broker last acknowledged it, or a member last showed its event
            still running as long work (:meth:`ProcessedMarker.mark_running`); None if never.
    """

    id: str
    source: str
    tenant: str
    key: str
    topic: str
    lane: str
    event_id: str
    received_at_ms: int
    headers: Mapping[str, str]
    body: bytes
    state: RowState
    produce_attempts: int = 0
    replay_count: int = 0
    last_error: str = ""
    produced_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Selection:
    """Which rows a replay or a count looks at; empty fields match everything.

    Attributes:
        source: only rows of this source.
        tenant: only rows of this tenant.
        since_ms: only rows received at or after this time (ms since the epoch).
        until_ms: only rows received before this time (ms since the epoch).
        states: only rows in one of these states.
        ids: only these row ids.
        through_id: only rows whose id sorts at or below this one; a replay sets it to the
            selection's last id when it starts (:meth:`ReplayLog.last_id`), so that what
            arrives or joins the selection above it while the replay runs is left out.
    """

    source: str | None = None
    tenant: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    states: tuple[RowState, ...] = ()
    ids: tuple[str, ...] = field(default=())
    through_id: str | None = None


class IngressLog(Protocol):
    """What the ingress needs: a durable, deduplicating insert and produce bookkeeping."""

    async def insert(self, row: NewRow) -> bool:
        """Store ``row`` durably; False when ``(source, event_id)`` is already stored.

        Concurrent calls are committed together (group commit); each returns once its row is
        durable. Raises :class:`~pipeline.logstore.LogStoreError` when the database fails.
        """
        ...

    async def mark_produced(self, ids: Sequence[str]) -> None:
        """Record that the broker acknowledged these rows (``received -> produced``)."""
        ...

    async def record_failure(self, ids: Sequence[str], error: str) -> None:
        """Count a failed produce attempt on these rows and keep ``error`` as the last error."""
        ...


class ProcessedMarker(Protocol):
    """What the consumer runtime needs: mark rows whose event was handled."""

    async def mark_processed(self, ids: Sequence[str]) -> int:
        """Mark these rows processed in one batch; returns how many changed state.

        Idempotent; unknown ids and abandoned rows are left alone.
        """
        ...

    async def mark_running(self, ids: Sequence[str]) -> int:
        """Show these ``produced`` rows' events still running, in one batch; returns how many.

        Their ``produced_at_ms`` becomes now: the sweeper's patience counts from it, so a long
        run shown alive this way is not replayed under it. Other rows are left alone.
        """
        ...


class SweepLog(IngressLog, Protocol):
    """What the sweeper needs: claim overdue rows, produce and replay them, abandon loudly."""

    async def claim_unproduced(
        self, received_before_ms: int, limit: int, lease_ms: int
    ) -> list[LogRow]:
        """Lease up to ``limit`` rows still ``received`` that arrived before the given time."""
        ...

    async def claim_unprocessed(
        self,
        produced_before_ms: int,
        limit: int,
        lease_ms: int,
        *,
        patient_topics: Collection[str] = (),
        overdue_before_ms: int = 0,
        overdue_by_topic_ms: Mapping[str, int] | None = None,
    ) -> list[LogRow]:
        """Lease up to ``limit`` ``produced`` rows last produced before ``produced_before_ms``.

        Rows of ``patient_topics`` (lanes with a backlog) are claimed only when they were last
        produced before ``overdue_before_ms`` (the maximum patience), or before their topic's
        time in ``overdue_by_topic_ms`` (a lane whose events wait longer by design).
        """
        ...

    async def has_processed(self, lane: str) -> bool | None:
        """Whether any row of ``lane`` is ``processed``: has a member of it ever marked one?

        One probe of an index of the processed rows' lanes, however many rows the log holds
        (a lane none of whose rows was ever marked would otherwise scan it whole). None, unknown,
        while that index is missing: a log too large when this version first opened it is not
        indexed at open (the build would hold its writes), but by the operator (a warning at open
        names the command); the question never scans the table instead.
        """
        ...

    async def mark_replayed(self, ids: Sequence[str]) -> None:
        """Count one more replay of the sweeper's on these rows, acknowledged just now.

        A received or abandoned row becomes produced; a processed row stays processed. A replay
        by hand is :meth:`ReplayLog.mark_replayed_by_hand`, which starts the count again.
        """
        ...

    async def abandon(self, ids: Sequence[str], reason: str, *, min_replays: int = 0) -> int:
        """Give up on these rows (``-> abandoned``) and keep ``reason`` as their last error.

        Only rows still ``received`` or ``produced`` whose ``replay_count`` is at least
        ``min_replays`` change; returns how many did. The sweeper passes its ``max_replays``
        for a row it found spent when it claimed it: one replayed by hand since (its count 0
        again, :meth:`ReplayLog.mark_replayed_by_hand`) is left to its fresh start.
        """
        ...


class ReplayLog(Protocol):
    """What the replay CLI needs: page through a selection and count it."""

    async def select(self, selection: Selection, *, after_id: str = "", limit: int) -> list[LogRow]:
        """Up to ``limit`` rows of ``selection`` with ids above ``after_id``, in id order."""
        ...

    async def last_id(self, selection: Selection) -> str | None:
        """The highest id of ``selection`` (in the order :meth:`select` pages), or None if empty."""
        ...

    async def count_by_state(self, selection: Selection) -> dict[RowState, int]:
        """How many rows of ``selection`` are in each state (states with none are left out)."""
        ...

    async def get(self, row_id: str) -> LogRow | None:
        """One row by id, or None."""
        ...

    async def mark_replayed_by_hand(self, ids: Sequence[str]) -> None:
        """Record a replay by hand of these rows, acknowledged by the broker just now.

        A fresh start for the sweeper: their ``replay_count`` (counted against its
        ``max_replays``) is 0 again and their patience counts from now. A received or abandoned
        row becomes produced (watched by the sweeper again); a processed row stays processed.
        """
        ...


class LogStore(SweepLog, ProcessedMarker, ReplayLog, Protocol):
    """A whole log store: every role (SweepLog includes IngressLog), lifecycle and retention."""

    async def open(self) -> None:
        """Connect and create the tables if they are missing (idempotent)."""
        ...

    def observe_commits(self, committed: Committed) -> None:
        """Tell ``committed`` of every group commit of inserts: its rows and its seconds.

        A commit's time is what each webhook it carried waited for its row to be durable (with
        SQLite ``FULL`` or PostgreSQL, the flush to disk is part of it).
        """
        ...

    async def close(self) -> None:
        """Finish pending writes and release connections."""
        ...

    async def probe_write(self, body_bytes: int = 0) -> None:
        """Commit a write that keeps nothing: whether a webhook's row would commit now.

        A row whose body is ``body_bytes`` (incompressible) bytes, inserted and deleted in one
        transaction, which no reader sees. The ingress tries it each second while unready after
        a failed insert, as large as the largest row body its sources write: on a nearly full
        volume a small row commits where a webhook of ordinary size does not.

        Raises:
            LogStoreError: the store cannot write (a full volume, a read-only or unreachable
                server).
        """
        ...

    async def purge(
        self,
        older_than_ms: int,
        states: Collection[RowState] = TERMINAL_STATES,
    ) -> int:
        """Delete rows received before ``older_than_ms`` in ``states``; returns how many."""
        ...

    async def oldest_unfinished_ms(self, received_before_ms: int) -> int | None:
        """When the oldest row neither processed nor abandoned received before then arrived.

        None when there is none. Such a row may still be produced again (the sweeper,
        ``pipeline replay``), so the offload purge keeps what it points to. One walk of the
        ``received_at_ms`` index from its oldest end, stopping at the first such row: it reads
        only the finished rows older than that, which ``pipeline purge`` deletes.
        """
        ...
