"""Replaying log rows by hand (``pipeline replay``): select, pace, produce, count.

Rows are read in id (arrival) order, a page at a time, and produced to the topic they were
routed to, with their original key, event id and body, and marked produced again: a replayed
abandoned row is watched by the sweeper once more. A replay by hand is a fresh start for the
sweeper: the row's ``replay_count``, which the sweeper counts against ``max_replays``, is set
back to 0, and its patience counts from now. An operator who replays a window, fixes the handler
and replays it again has not spent the sweeper's replays, and an abandonment the sweeper pages
about afterwards counts the sweeper's own replays only. The copy still says it is one: its
``replay-count`` header is the row's count before the replay plus one, never 0. Consumers
deduplicate on the event id, so replaying a row that was in fact processed is harmless. A dry run
only counts the selection.

The pages stop at the selection's last id when the replay starts, and each begins after the last
id of the one before (ids are unique: no row is read twice or passed over). A row that arrives
while the replay runs is left out; one that leaves the selection meanwhile (processed by a
consumer) is skipped without letting another in; one that joins it below the bound (abandoned
by the sweeper) is taken if its page is still ahead. Only ids are compared, never clocks.

A page the broker could not take because it was unreachable (:class:`BrokerUnavailable`: Redis
down, Kafka's brokers gone past the message timeout) ends the replay there: the pages after it
would each fail the same way (on Kafka only after the timeout, page by page), so they are not
attempted, and the summary says where it stopped. A row that failed on its own (its topic gone,
too large for it now) is counted per topic and error, and the rest go on. Each row whose produce
failed keeps its state and ``replay_count`` and has the attempt counted and the error kept as
its ``last_error``, as after a failed produce of the sweeper's.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from pipeline.errors import BrokerUnavailable, PipelineError
from pipeline.ingress.republish import produce_rows
from pipeline.logstore import LogRow, LogStore, RowState, Selection
from pipeline.transport.protocol import Producer

_PAGE = 200


@dataclass(slots=True)
class ReplaySummary:
    """What a replay matched and did.

    Attributes:
        matched: rows in the selection when the replay started, by state.
        replayed: rows produced again.
        failed: rows whose produce failed, by error class.
        by_topic: rows replayed per topic.
        dry_run: whether nothing was produced.
        handled: rows of the pages attempted (replayed, failed, or left the selection).
        failures: rows whose produce failed per (topic, error class), with the first error's
            text.
        stopped: the broker error that ended the replay before its last page, if one did.
    """

    matched: dict[RowState, int]
    replayed: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    by_topic: Counter[str] = field(default_factory=Counter)
    dry_run: bool = False
    handled: int = 0
    failures: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    stopped: BrokerUnavailable | None = None

    def fail(self, topic: str, exc: Exception) -> None:
        """Count one row to ``topic`` whose produce raised ``exc``."""
        name = type(exc).__name__
        self.failed[name] += 1
        count, text = self.failures.get((topic, name), (0, str(exc)))
        self.failures[(topic, name)] = (count + 1, text)

    @property
    def total(self) -> int:
        """Rows matched, all states together."""
        return sum(self.matched.values())


class Pacer:
    """Spaces actions ``1 / rate`` seconds apart on average (no bursts above the rate)."""

    def __init__(
        self, rate_per_s: float | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Pace at ``rate_per_s``; None or 0 means as fast as possible."""
        self._interval_s = 1.0 / rate_per_s if rate_per_s else 0.0
        self._clock = clock
        self._next = clock()

    async def wait(self, count: int = 1) -> None:
        """Wait until ``count`` more actions are allowed."""
        if not self._interval_s:
            return
        now = self._clock()
        self._next = max(self._next, now)
        delay = self._next - now
        self._next += count * self._interval_s
        if delay > 0:
            await asyncio.sleep(delay)


async def replay(
    log_store: LogStore,
    producer: Producer | None,
    selection: Selection,
    *,
    rate_per_s: float | None = None,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
) -> ReplaySummary:
    """Replay every row of ``selection``; ``progress(n)`` is called after each page of n rows.

    Args:
        log_store: the log.
        producer: where events go; may be None for a dry run.
        selection: which rows.
        rate_per_s: most rows produced per second (None: unpaced).
        dry_run: count only.
        progress: called with the number of rows just handled.
    """
    last_id = await log_store.last_id(selection)
    if last_id is None:
        return ReplaySummary({}, dry_run=dry_run)
    # The bound is a row id, fixed now: the pages stop there whatever arrives, joins or leaves
    # the selection meanwhile (a row count taken now would stop short or run past it then).
    selection = replace(selection, through_id=last_id)
    summary = ReplaySummary(await log_store.count_by_state(selection), dry_run=dry_run)
    if dry_run or producer is None or not summary.total:
        return summary
    pacer = Pacer(rate_per_s)
    # A page holds a tenth of a second of the rate, so the rate holds at that granularity.
    page_size = max(1, min(_PAGE, int(rate_per_s / 10))) if rate_per_s else _PAGE
    after_id = ""
    while True:
        rows = await log_store.select(selection, after_id=after_id, limit=page_size)
        if not rows:
            break
        after_id = rows[-1].id
        await pacer.wait(len(rows))
        outcome = await produce_rows(producer, rows, replay=True)
        await log_store.mark_replayed_by_hand([row.id for row in outcome.delivered])
        summary.replayed += len(outcome.delivered)
        summary.by_topic.update(row.topic for row in outcome.delivered)
        await _record_failures(log_store, outcome.failed)
        for row, exc in outcome.failed:
            summary.fail(row.topic, exc)
        summary.handled += len(rows)
        if progress is not None:
            progress(len(rows))
        summary.stopped = next(
            (exc for _, exc in outcome.failed if isinstance(exc, BrokerUnavailable)), None
        )
        if summary.stopped is not None or len(rows) < page_size:
            break
    return summary


async def _record_failures(
    log_store: LogStore, failed: Sequence[tuple[LogRow, PipelineError]]
) -> None:
    """Count the failed attempt on each row and keep its error, one write per error text.

    The rows keep their state and ``replay_count``, as after a sweeper's failed produce.
    """
    by_error: dict[str, list[str]] = defaultdict(list)
    for row, exc in failed:
        by_error[f"{type(exc).__name__}: {exc}"].append(row.id)
    for error, ids in by_error.items():
        await log_store.record_failure(ids, error)
