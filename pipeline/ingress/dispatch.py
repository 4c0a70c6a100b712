"""The fast path after the answer: produce each committed row, then mark it produced.

Rows queue per topic; one pump per topic hands everything queued to
:meth:`~pipeline.transport.protocol.Producer.send_many` at once (the batch grows with the load,
like group commit) and, on the broker's acknowledgement, queues the row ids for one batched
:meth:`~pipeline.logstore.IngressLog.mark_produced`. A failed produce counts an attempt on the
rows and leaves them ``received``: the sweeper produces them later, so a broker outage costs
latency, never events. The queue is bounded in rows and in body bytes (a stalled broker must not
hold thousands of 1 MiB bodies in memory); a row that does not fit is left to the sweeper.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass

from pipeline import tracing
from pipeline.cancel_tasks import cancel_until_done
from pipeline.envelope import Record
from pipeline.errors import PipelineError
from pipeline.ingress.headers import event_headers, event_key
from pipeline.logstore import IngressLog, NewRow
from pipeline.transport.protocol import Producer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class DispatchCounters:
    """What the fast path did since start."""

    produced: int = 0
    failed: int = 0
    overflowed: int = 0


REASON_CHARS = 300
"""Most characters of a failure's reason in a log line (a broker's message can be long)."""


def reason(exc: BaseException) -> str:
    """``exc`` for one log line: its class and message, cut to :data:`REASON_CHARS`."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


class Dispatcher:
    """Produces committed rows in the background and marks them produced."""

    def __init__(
        self,
        producer: Producer,
        log_store: IngressLog,
        *,
        queue_max: int = 10_000,
        queue_max_bytes: int = 64 * 1024 * 1024,
        batch_max: int = 500,
        linger_s: float = 0.005,
        mark_interval_s: float = 0.2,
    ) -> None:
        """Produce with ``producer``; keep at most ``queue_max`` rows waiting.

        The bodies of the rows waiting (queued or being produced) total at most
        ``queue_max_bytes``.

        ``linger_s`` lets a batch fill before it is produced (the webhook is already answered,
        so this costs no accept latency, and fewer, larger batches cost the broker client less
        CPU). Marks are written at most every ``mark_interval_s``: each is a transaction (an
        fsync on SQLite) competing with the inserts, and a lost mark only means one extra
        replay by the sweeper.
        """
        self._producer = producer
        self._log = log_store
        self._queue_max = queue_max
        self._queue_max_bytes = queue_max_bytes
        self._batch_max = batch_max
        self._linger_s = linger_s
        self._mark_interval_s = mark_interval_s
        self._queued: dict[str, list[NewRow]] = defaultdict(list)
        self._size = 0
        self._bytes = 0
        self._pumps: dict[str, asyncio.Task[None]] = {}
        self._marks: list[str] = []
        self._marker: asyncio.Task[None] | None = None
        self._accepting = True
        self.counters = DispatchCounters()

    @property
    def waiting(self) -> int:
        """Rows queued or being produced."""
        return self._size

    @property
    def waiting_bytes(self) -> int:
        """Body bytes of the rows queued or being produced."""
        return self._bytes

    def submit(self, row: NewRow) -> bool:
        """Queue ``row`` for production; False (left to the sweeper) when the queue is full.

        Full is ``queue_max`` rows, or ``row``'s body not fitting in ``queue_max_bytes``.
        """
        if (
            not self._accepting
            or self._size >= self._queue_max
            or self._bytes + len(row.body) > self._queue_max_bytes
        ):
            self.counters.overflowed += 1
            return False
        self._queued[row.topic].append(row)
        self._size += 1
        self._bytes += len(row.body)
        if row.topic not in self._pumps:
            self._pumps[row.topic] = asyncio.create_task(self._pump(row.topic))
        return True

    async def close(self, timeout_s: float = 10.0) -> None:
        """Stop taking rows, give the queued ones ``timeout_s`` to go, then flush the marks.

        Rows still unproduced stay ``received`` in the log; the sweeper produces them.
        """
        self._accepting = False
        pumps = list(self._pumps.values())
        if pumps:
            _, pending = await asyncio.wait(pumps, timeout=timeout_s)
            await cancel_until_done(*pending)  # a produce below may lose a first cancellation
        while self._marker is not None:
            await asyncio.shield(self._marker)

    async def _pump(self, topic: str) -> None:
        queue = self._queued[topic]
        try:
            while queue:
                if len(queue) < self._batch_max and self._accepting and self._linger_s:
                    await asyncio.sleep(self._linger_s)
                rows = queue[: self._batch_max]
                del queue[: self._batch_max]
                try:
                    await self._produce(topic, rows)
                finally:
                    self._size -= len(rows)
                    self._bytes -= sum(len(row.body) for row in rows)
        finally:
            del self._pumps[topic]

    async def _produce(self, topic: str, rows: list[NewRow]) -> None:
        records = [Record(row.body, event_key(row), event_headers(row)) for row in rows]
        sends = tracing.sends_started(topic, records)
        try:
            await self._producer.send_many(topic, records)
        except PipelineError as exc:
            tracing.sends_ended(sends, exc)
            self.counters.failed += len(rows)
            # One line with the reason; repeats are backed off by the handlers' RepeatFilter,
            # which takes lines alike but for their numbers (a count, a port, a timeout) as one.
            log.warning(
                "produce of %d rows to %s failed (%s); the sweeper will retry",
                len(rows),
                topic,
                reason(exc),
                extra={"topic": topic, "rows": len(rows), "error": str(exc)},
            )
            await self._record_failure(rows, exc)
            return
        tracing.sends_ended(sends)
        self.counters.produced += len(rows)
        self._marks.extend(row.id for row in rows)
        if self._marker is None:
            self._marker = asyncio.create_task(self._mark())

    async def _record_failure(self, rows: list[NewRow], exc: PipelineError) -> None:
        try:
            await self._log.record_failure([row.id for row in rows], f"{type(exc).__name__}: {exc}")
        except PipelineError as failed:
            # The rows stay received either way: the sweeper produces them again. One line
            # (the log store's reason names a full volume), backed off like the mark's below.
            log.warning(
                "could not record a produce failure of %d rows in the log store: %s; they stay "
                "received and the sweeper will produce them again",
                len(rows),
                failed,
            )

    async def _mark(self) -> None:
        try:
            while self._marks:
                if self._accepting and self._mark_interval_s:
                    await asyncio.sleep(self._mark_interval_s)
                ids, self._marks = self._marks, []
                try:
                    await self._log.mark_produced(ids)
                except PipelineError as exc:
                    # The events are out; unmarked rows get produced once more by the sweeper
                    # and deduplicated downstream by event id. A known failure (a full log
                    # volume fails every batch): one line, its repeats backed off by the
                    # handlers' RepeatFilter (numbers aside, every batch's line is alike).
                    log.warning(
                        "could not mark %d rows produced in the log store: %s; they stay "
                        "received and the sweeper will produce them again",
                        len(ids),
                        exc,
                    )
        finally:
            self._marker = None
