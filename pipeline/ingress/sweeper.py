"""The sweeper: produces what the fast path lost, replays what nobody processed, abandons loudly.

Each sweep, for rows it claims (leases) in the log store:

1. **Unproduced**: rows still ``received`` ``unproduced_after_s`` after receipt (the ingress
   died between commit and produce, or the broker was down) are produced. A failure only counts
   an attempt: the broker being down is never a reason to give up on a row.
2. **Unprocessed**: rows ``produced`` but not reported processed ``patience_s`` after their last
   production (or the last tick of a member that showed their long work still running:
   ``mark_running``) are replayed, but only while their lane has no backlog (then they are most
   likely queued, not lost), and regardless once ``max_patience_s`` has passed (late is not lost,
   yet a lost event's wait stays bounded). A lane whose events wait longer than that by design
   (retry tiers, a batch SLA: ``lane_delays_s``) is given its wait plus ``patience_s`` instead, so
   an event that is merely waiting its turn is neither copied nor abandoned. A debounced lane's
   events wait for their turn with their offsets committed, a wait no lag shows: its rows are given
   the lane's debounce window (``lane_windows_s``) on top of their patience, backed up or not. A
   row of a debounced lane whose event the debouncer still holds in a buffer (its turn waiting
   or running, however long: ``buffered``) is not replayed: it is shown running
   (``mark_running``), so its patience starts again, its ``replay_count`` unchanged; when Redis
   does not answer, or holds no such event, the row is replayed. Each replay increments the row's
   ``replay_count``, which travels in the event's ``replay-count`` header.
3. **Abandoned**: a row due for a replay that already had ``max_replays`` is abandoned instead:
   something in it keeps its consumer from finishing, and replaying it would keep doing so. It
   is logged at CRITICAL with the reason, and counted. The abandon is written only while the
   row's ``replay_count`` still says it is spent: a replay by hand that lands between the claim
   and the abandon (its count 0 again) leaves it to the fresh start it gives.

Members mark rows only with ``PIPELINE_RUNTIME__MARK_PROCESSED=true``: without it every webhook
of their lane is handled, then replayed and abandoned all the same. Before it replays or abandons
rows of a lane, the sweeper asks the log whether any row of the lane was ever marked processed
(:meth:`~pipeline.logstore.SweepLog.has_processed`, one index probe, asked once a sweep until
one is found): while none is, the lane is named in one warning (per process, not per row or
sweep) with its consumer group and the setting, and its abandonments' reason says so too. A log
without that index (too large to build it at open: the store warned, naming the command that
builds it) cannot tell, and the sweeper neither warns nor adds the hint until it is built.

The sweeper never consumes the lanes it watches, so a backed-up lane cannot hold it up. Asked
to stop (:meth:`Sweeper.run`'s event), a sweep ends once the batch in hand is produced and
marked: it claims no further batch, so stopping never waits for the rest of a long sweep (a
broker that is down costs one produce timeout per batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pipeline.config import SweeperSettings
from pipeline.errors import MessageTooLarge, PipelineError
from pipeline.ingress.backlog import Backlog
from pipeline.ingress.republish import produce_rows
from pipeline.logstore import LogRow, ProcessedMarker, SweepLog
from pipeline.transport.protocol import Producer

log = logging.getLogger(__name__)

_MAX_BATCHES_PER_SWEEP = 1_000  # bounds one sweep; the next one continues


class SweptLog(SweepLog, ProcessedMarker, Protocol):
    """What the sweeper needs of a log store: claims, replays, and showing rows still running."""


class BufferedEvents(Protocol):
    """Which events still wait in a debounced lane's buffers (the debouncer's Redis)."""

    def watches(self, lane: str) -> bool:
        """Whether ``lane`` is a debounced lane this asks about."""
        ...

    async def held(self, lane: str, event_ids: Sequence[str], keep_ms: int) -> set[str]:
        """The ids among ``event_ids`` still buffered in ``lane``, kept ``keep_ms`` more."""
        ...

    async def close(self) -> None:
        """Release the connection."""
        ...


@dataclass(slots=True)
class SweepReport:
    """What one sweep (or, in :attr:`Sweeper.totals`, every sweep so far) did."""

    produced: int = 0
    replayed: int = 0
    abandoned: int = 0
    failed: int = 0
    buffered: int = 0
    """Rows left to their turn: their event still waits in a debounced lane's buffer."""
    patient_lanes: tuple[str, ...] = ()
    finished: bool = True
    """False for a sweep that raised part way: its rows count, its run does not."""

    def add(self, other: SweepReport) -> None:
        """Add ``other``'s counts to this report."""
        self.produced += other.produced
        self.replayed += other.replayed
        self.abandoned += other.abandoned
        self.failed += other.failed
        self.buffered += other.buffered


class Sweeper:
    """Sweeps one log store; run :meth:`sweep_once` from a CLI or :meth:`run` as a task."""

    def __init__(
        self,
        log_store: SweptLog,
        producer: Producer,
        backlog: Backlog,
        lane_topics: Mapping[str, Sequence[str]],
        settings: SweeperSettings,
        *,
        clock: Callable[[], float] = time.time,
        on_sweep: Callable[[SweepReport], None] | None = None,
        lane_delays_s: Mapping[str, float] | None = None,
        lane_windows_s: Mapping[str, float] | None = None,
        buffered: BufferedEvents | None = None,
    ) -> None:
        """Sweep ``log_store``; ``lane_topics`` lists the topics of every lane it may replay.

        ``lane_delays_s`` is the longest a lane's events wait by design (its retry tiers, its
        batch SLA); a backed-up lane's rows are overdue only once that plus ``patience_s`` has
        passed, when it is longer than ``max_patience_s``. ``lane_windows_s`` is the longest a
        debounced lane's events wait for their turn (its ``max_wait_s``), which shows in no lag:
        it is added to the lane's patience, and to its overdue bound when backed up.
        ``buffered`` tells which of those lanes' events still wait in the debouncer's buffers:
        their rows are shown running instead of being replayed (closed by :meth:`close`).

        ``on_sweep`` is told each sweep (the rows metric, and for a ``finished`` one the
        heartbeat that shows the sweeper is alive).
        """
        self._log = log_store
        self._producer = producer
        self._backlog = backlog
        self._lane_topics = lane_topics
        self._lane_delays_s = lane_delays_s or {}
        self._lane_windows_s = lane_windows_s or {}
        self._buffered = buffered
        self._settings = settings
        self._clock = clock
        self.totals = SweepReport()
        self.on_sweep = on_sweep
        self._stop: asyncio.Event | None = None
        self._marking_lanes: set[str] = set()
        """Lanes a row of which was found processed: their members mark, never asked again."""
        self._unmarked_lanes: set[str] = set()
        """Lanes none of whose rows was processed when last asked (each warned about once)."""

    async def sweep_once(self) -> SweepReport:
        """One full sweep: unproduced rows, then unprocessed ones past patience.

        A sweep that raises part way (the log store or broker gone) still adds the rows it
        acted on to :attr:`totals` and tells ``on_sweep``, marked not ``finished``, then raises.
        """
        report = SweepReport()
        try:
            await self._produce_unproduced(report)
            if not self._stopping():  # reading the lanes' lag may wait on the broker too
                await self._replay_unprocessed(report)
        except BaseException:
            report.finished = False
            self._count(report)
            raise
        self._count(report)
        if report.produced or report.replayed or report.abandoned or report.failed:
            log.info(
                "sweep: produced %d, replayed %d, abandoned %d, failed %d; patient lanes: %s",
                report.produced,
                report.replayed,
                report.abandoned,
                report.failed,
                ", ".join(report.patient_lanes) or "none",
            )
        return report

    async def close(self) -> None:
        """Release what the sweeper holds of its own (the debouncer's Redis client)."""
        if self._buffered is not None:
            await self._buffered.close()

    def _count(self, report: SweepReport) -> None:
        self.totals.add(report)
        if self.on_sweep is not None:
            self.on_sweep(report)

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every ``interval_s`` until ``stop`` is set; a failed sweep is logged, not fatal.

        A known failure (a broker or store down) is one warning line; any other error is logged
        with its traceback. Either way the next sweep runs at the next interval, and a sweeper
        that keeps failing leaves its last-run time behind for the silent-sweeper alert. Once
        ``stop`` is set, the sweep under way ends after the batch in hand.
        """
        self._stop = stop
        while not stop.is_set():
            try:
                await self.sweep_once()
            except PipelineError as exc:  # a known failure (a broker or store down): one line
                log.warning("sweep failed: %s; retrying in %.0fs", exc, self._settings.interval_s)
            except Exception as exc:  # a bug, or data no check foresaw: its traceback too
                log.exception(
                    "sweep failed (%s: %s); retrying in %.0fs",
                    type(exc).__name__,
                    exc,  # noqa: TRY401 - the line says the cause where a traceback is cut off
                    self._settings.interval_s,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._settings.interval_s)

    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    def _ms(self, seconds_ago: float) -> int:
        return int((self._clock() - seconds_ago) * 1000)

    async def _produce_unproduced(self, report: SweepReport) -> None:
        s = self._settings
        for _ in range(_MAX_BATCHES_PER_SWEEP):
            if self._stopping():
                return
            rows = await self._log.claim_unproduced(
                self._ms(s.unproduced_after_s), s.batch_size, int(s.lease_s * 1000)
            )
            if rows:
                outcome = await produce_rows(self._producer, rows, replay=False)
                await self._log.mark_produced([row.id for row in outcome.delivered])
                report.produced += len(outcome.delivered)
                await self._failed(outcome.failed, report)
            if len(rows) < s.batch_size:
                return

    async def _replay_unprocessed(self, report: SweepReport) -> None:
        s = self._settings
        patient = [lane for lane in self._lane_topics if await self._backlog.is_backlogged(lane)]
        report.patient_lanes = tuple(patient)
        # A lane that waits longer by design is overdue only once its own wait has passed too;
        # a debounced lane's rows, backed up or not, wait out its window on top of patience.
        late_s: dict[str, float] = {}
        for lane, topics in self._lane_topics.items():
            window_s = self._lane_windows_s.get(lane, 0.0)
            if lane in patient:
                wait_s = s.patience_s + self._lane_delays_s.get(lane, 0.0) + window_s
                if wait_s <= s.max_patience_s:
                    continue
            elif window_s > 0:
                wait_s = s.patience_s + window_s
            else:
                continue
            late_s.update(dict.fromkeys(topics, wait_s))
        patient_topics = {topic for lane in patient for topic in self._lane_topics[lane]}
        patient_topics.update(late_s)  # a topic of its own overdue time is claimed only past it
        asked: set[str] = set()  # lanes asked whether their rows are ever marked, this sweep
        for _ in range(_MAX_BATCHES_PER_SWEEP):
            if self._stopping():
                return
            rows = await self._log.claim_unprocessed(
                self._ms(s.patience_s),
                s.batch_size,
                int(s.lease_s * 1000),
                patient_topics=patient_topics,
                overdue_before_ms=self._ms(s.max_patience_s),
                overdue_by_topic_ms={topic: self._ms(wait_s) for topic, wait_s in late_s.items()},
            )
            claimed = len(rows)
            rows = await self._leave_buffered(rows, report)
            await self._ask_marked(rows, asked)
            await self._replay_or_abandon(rows, report)
            if claimed < s.batch_size:
                return

    async def _replay_or_abandon(self, rows: list[LogRow], report: SweepReport) -> None:
        """Abandon the claimed ``rows`` that had ``max_replays``, replay the others."""
        s = self._settings
        for row in rows:
            if row.replay_count >= s.max_replays:
                report.abandoned += await self._abandon_spent(row)
        due = [row for row in rows if row.replay_count < s.max_replays]
        if due:
            outcome = await produce_rows(self._producer, due, replay=True)
            await self._log.mark_replayed([row.id for row in outcome.delivered])
            report.replayed += len(outcome.delivered)
            await self._failed(outcome.failed, report)

    async def _ask_marked(self, rows: list[LogRow], asked: set[str]) -> None:
        """Ask whether a row of each lane of ``rows`` was ever processed; warn once for each not.

        ``asked`` holds the lanes asked this sweep already (this adds to it). A lane found
        marked is never asked again; one that is not is asked again the next sweep with rows of
        it due, so that its abandonments lose the hint once its members mark. A log store that
        does not answer, or cannot tell (a log too large to index at open, until the operator
        builds the index), leaves what is known as it was: no warning, and no hint.
        """
        lanes = {row.lane for row in rows} - asked - self._marking_lanes
        asked.update(lanes)
        for lane in sorted(lanes):
            try:
                marked = await self._log.has_processed(lane)
            except PipelineError as exc:
                log.debug("cannot tell whether rows of lane %s are ever marked: %s", lane, exc)
                continue
            if marked is None:  # the log has no index to ask (a warning at its open said so)
                continue
            if marked:
                self._marking_lanes.add(lane)
                self._unmarked_lanes.discard(lane)
                continue
            if lane not in self._unmarked_lanes:
                self._unmarked_lanes.add(lane)
                log.warning(
                    "%s",
                    self._unmarked(lane),
                    extra={"lane": lane, "group": self._settings.lane_groups.get(lane, "")},
                )

    def _spent(self, row: LogRow) -> str:
        """Why ``row``, replayed ``max_replays`` times, is abandoned."""
        reason = f"abandoned after {row.replay_count} replays without being processed"
        if row.lane in self._unmarked_lanes:
            reason += f"; {self._unmarked(row.lane)}"
        return reason

    def _unmarked(self, lane: str) -> str:
        """Why every row of ``lane``, none of which was ever marked processed, is abandoned."""
        s = self._settings
        group = s.lane_groups.get(lane)
        patience_s = s.patience_s + self._lane_windows_s.get(lane, 0.0)
        return (
            f"no row of lane {lane}{f' (consumer group {group})' if group else ''} was ever "
            "marked processed in the log: its members run without "
            "PIPELINE_RUNTIME__MARK_PROCESSED=true (or none consumes it), so every webhook of it "
            f"is replayed after {patience_s:g} s and abandoned after {s.max_replays} replays"
        )

    async def _leave_buffered(self, rows: list[LogRow], report: SweepReport) -> list[LogRow]:
        """``rows`` but those whose event waits in a debounced lane's buffer, shown running.

        One call per debounced lane of the batch. A lane whose Redis does not answer keeps its
        rows: they are replayed, as they would be without a debouncer (a copy, never a loss).
        """
        asked: dict[str, list[LogRow]] = defaultdict(list)
        if self._buffered is not None:
            for row in rows:
                if row.event_id and self._buffered.watches(row.lane):
                    asked[row.lane].append(row)
        if not asked:
            return rows
        s = self._settings
        keep_ms = round(
            2
            * 1000
            * (
                s.patience_s
                + s.interval_s
                + s.lease_s
                + max(self._lane_windows_s.values(), default=0.0)
            )
        )
        assert self._buffered is not None  # noqa: S101 - asked is empty otherwise
        left: set[str] = set()
        for lane, lane_rows in asked.items():
            try:
                held = await self._buffered.held(lane, [r.event_id for r in lane_rows], keep_ms)
            except PipelineError as exc:
                log.warning(
                    "cannot tell which events of lane %s wait for their turn: %s", lane, exc
                )
                continue
            left.update(row.id for row in lane_rows if row.event_id in held)
        if not left:
            return rows
        await self._log.mark_running(sorted(left))
        report.buffered += len(left)
        return [row for row in rows if row.id not in left]

    async def _failed(
        self, failed: list[tuple[LogRow, PipelineError]], report: SweepReport
    ) -> None:
        report.failed += len(failed)
        for row, exc in failed:
            if isinstance(exc, MessageTooLarge):
                report.abandoned += await self._abandon(row, f"unproducible: {exc}")
            else:
                await self._log.record_failure([row.id], f"{type(exc).__name__}: {exc}")

    async def _abandon_spent(self, row: LogRow) -> int:
        """Abandon ``row``, spent when claimed, unless its count started again since: 1 or 0.

        A replay by hand that lands between the claim and the abandon sets the row's
        ``replay_count`` back to 0 (a fresh start): the store then leaves it as it is.
        """
        abandoned = await self._abandon(row, self._spent(row), self._settings.max_replays)
        if not abandoned:
            log.info(
                "not abandoned: the row was replayed by hand or processed since it was claimed",
                extra={"row_id": row.id, "lane": row.lane, "topic": row.topic},
            )
        return abandoned

    async def _abandon(self, row: LogRow, reason: str, min_replays: int = 0) -> int:
        """Abandon ``row`` (logged CRITICAL) if it still has ``min_replays``; 1 if it was, or 0."""
        if not await self._log.abandon([row.id], reason, min_replays=min_replays):
            return 0
        log.critical(
            "webhook abandoned: %s",
            reason,
            extra={
                "row_id": row.id,
                "source": row.source,
                "tenant": row.tenant,
                "event_id": row.event_id,
                "lane": row.lane,
                "topic": row.topic,
                "replay_count": row.replay_count,
            },
        )
        return 1
