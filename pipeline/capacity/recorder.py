"""Counting arrivals off the hot path: in-memory counters, flushed to Redis on a timer.

A producer calls :meth:`ArrivalRecorder.add` once per produced batch (a dictionary add, no I/O);
every ``flush_interval_s`` the counts gathered since the last flush go to
:class:`~pipeline.capacity.history.ArrivalHistory` in one pipelined round trip. When Redis
fails the counts are kept and sent again at the next flush, up to :data:`MAX_PENDING` distinct
(lane, minute) cells; past that the oldest are dropped and counted in :attr:`dropped`
(history is a forecast input, never worth blocking or growing without bound for). A failed
flush is sent again as it was, under its number
(:meth:`~pipeline.capacity.history.ArrivalHistory.add_once`): when Redis had applied it and only
the reply was lost, it is not added twice.

:class:`CountingProducer` wraps any :class:`~pipeline.transport.protocol.Producer` and records
each acknowledged batch under its topic's lane; topics that are not a lane's main topic (retry
tiers, dead letters) are not arrivals and are not counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from redis import exceptions as rexc

from pipeline.capacity.history import ArrivalHistory, Flush
from pipeline.envelope import Delivered, Record
from pipeline.transport.protocol import Producer

__all__ = ["MAX_PENDING", "ArrivalRecorder", "CountingProducer"]

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
"""Most (lane, minute) cells held while Redis is unavailable (about a week of one lane)."""


class ArrivalRecorder:
    """Gathers arrivals per (lane, minute) and flushes them every ``flush_interval_s``."""

    def __init__(
        self,
        history: ArrivalHistory,
        *,
        flush_interval_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Flush into ``history``; ``clock`` gives Unix seconds (tests pass their own)."""
        self._history = history
        self._interval_s = flush_interval_s
        self._clock = clock
        self._counts: Counter[tuple[str, int]] = Counter()
        self._writer = uuid.uuid4().hex
        self._numbered = 0
        self._unsent: list[tuple[int, Counter[tuple[str, int]]]] = []
        """Flushes sent without a reply (Redis may have applied them), oldest first."""
        self._settled: dict[str, list[int]] = {}
        """Flushes applied, per lane, whose numbers Redis may forget (sent with the next)."""
        self._flushing = asyncio.Lock()
        self._served: dict[tuple[str, int], tuple[int, float]] = {}
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.flushed = 0
        """Arrivals written to Redis since start."""
        self.dropped = 0
        """Arrivals given up on because Redis stayed unavailable."""

    @property
    def pending(self) -> int:
        """Arrivals counted and not yet written."""
        return sum(self._counts.values()) + sum(sum(c.values()) for _, c in self._unsent)

    def add(self, lane: str, count: int) -> None:
        """Count ``count`` arrivals on ``lane`` now (no I/O; safe on the hot path)."""
        if count > 0:
            self._counts[lane, int(self._clock() // 60)] += count

    def served(self, lane: str, count: int, total_s: float) -> None:
        """Count ``count`` finished messages of ``lane`` that ran ``total_s`` seconds in all.

        No I/O: a member calls it per finished batch; the mean feeds the lane's service time.
        """
        if count > 0:
            cell = (lane, int(self._clock() // 60))
            done, seconds = self._served.get(cell, (0, 0.0))
            self._served[cell] = (done + count, seconds + total_s)

    def start(self) -> None:
        """Start flushing in the background (call from a running event loop)."""
        if self._task is None:
            self._stop.clear()
            self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        """Stop the timer and flush what is left (best effort)."""
        if self._task is not None:
            self._stop.set()
            await self._task
            self._task = None
        await self.flush()

    async def flush(self) -> None:
        """Write the counts gathered so far; on a Redis error keep them for the next flush.

        The counts become a numbered flush, sent with the flushes that failed before; one that
        failed is sent again unchanged, and Redis adds none twice. Flushes run one at a time.
        Service times are a recent mean only: a failed write of them is dropped, not retried.
        """
        async with self._flushing:
            if self._served:
                served, self._served = self._served, {}
                with contextlib.suppress(rexc.RedisError, OSError):
                    await self._history.add_service(served)
            if self._counts:
                self._numbered += 1
                self._unsent.append((self._numbered, self._counts))
                self._counts = Counter()
            if not self._unsent and not self._settled:
                return
            sent: list[Flush] = list(self._unsent)
            try:
                await self._history.add_once(self._writer, sent, settled=self._settled)
            except (rexc.RedisError, OSError) as exc:
                self._trim()
                log.warning("arrival history not written, will retry: %s", exc)
                return
            self._unsent = []
            self._settled = {}
            for number, counts in sent:
                for lane in {lane for lane, _ in counts}:
                    self._settled.setdefault(lane, []).append(number)
                self.flushed += sum(counts.values())

    def _trim(self) -> None:
        """Drop the oldest minutes' counts past :data:`MAX_PENDING` cells of unsent flushes."""
        cells = [(cell[1], index, cell) for index, (_, c) in enumerate(self._unsent) for cell in c]
        excess = len(cells) - MAX_PENDING
        if excess > 0:
            for _, index, cell in sorted(cells)[:excess]:
                self.dropped += self._unsent[index][1].pop(cell)
            self._unsent = [(number, counts) for number, counts in self._unsent if counts]

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._interval_s)
            await self.flush()


class CountingProducer:
    """A :class:`Producer` that records every acknowledged batch as arrivals of its lane."""

    def __init__(
        self, inner: Producer, recorder: ArrivalRecorder, lanes: Mapping[str, str]
    ) -> None:
        """Produce with ``inner``; ``lanes`` maps each main topic to its lane."""
        self._inner = inner
        self._recorder = recorder
        self._lanes = dict(lanes)

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivered:
        """Produce one message, then count it."""
        delivered = await self._inner.send(
            topic, value, key=key, headers=headers, partition=partition
        )
        self._count(topic, 1)
        return delivered

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Produce a batch, then count it once (a failed batch is not counted)."""
        delivered = await self._inner.send_many(topic, records)
        self._count(topic, len(delivered))
        return delivered

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait for the inner producer's acknowledgements."""
        await self._inner.flush(timeout_s)

    async def close(self) -> None:
        """Close the inner producer (the recorder is closed by its owner)."""
        await self._inner.close()

    def _count(self, topic: str, count: int) -> None:
        lane = self._lanes.get(topic)
        if lane is not None:
            self._recorder.add(lane, count)
