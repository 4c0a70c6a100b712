"""Batch lanes in a member: work that runs on idle capacity only, promoted near its SLA.

A lane with a ``batch:`` policy (``topics/*.yaml``) marks work nobody waits for: a nightly
re-index, a backfill. Its messages enter a :class:`BatchGate`, one FIFO per lane, before the key
lanes. The head of a lane's FIFO starts only while the member's handlers in use plus those
queued stay below ``idle_below`` of its concurrency limit, so interactive work always finds
room: batch work yields to it, and never makes a member look busy (the member leaves it out of
``pipeline_worker_slots_busy``, the autoscaler's signal). A message that has waited
``promote_at`` of its SLA since it was produced is promoted: it starts at once, whatever the
load, so it still completes in time.

Held messages keep their partition's flow-control count, so a partition whose batch backlog
reaches the high-water mark is paused: the backlog stays in the broker, not in memory. The FIFO
keeps per-key order; a revoked partition's held messages are dropped (the next owner reads them
again).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic

from pipeline.envelope import TopicPartition
from pipeline.runtime.work import T
from pipeline.topics.spec import BatchPolicy


class BatchGate(Generic[T]):
    """Holds batch messages until there is idle capacity or they near their SLA."""

    def __init__(
        self,
        start: Callable[[T], None],
        load: Callable[[], tuple[int, int]],
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        """``start(message)`` runs it; ``load()`` is (handlers in use or queued, limit)."""
        self._start = start
        self._load = load
        self._clock_ms = clock_ms
        self._held: dict[str, deque[tuple[T, BatchPolicy]]] = {}
        self.started = 0
        self.promoted = 0

    @property
    def waiting(self) -> int:
        """Batch messages held back now."""
        return sum(len(q) for q in self._held.values())

    @property
    def any_waiting(self) -> bool:
        """Whether a batch message is held back now (asked after every run: no sum)."""
        return any(self._held.values())

    def waiting_in(self, lane: str) -> int:
        """Batch messages of ``lane`` held back now."""
        return len(self._held.get(lane, ()))

    def offer(self, message: T, lane: str, policy: BatchPolicy) -> None:
        """Hold ``message`` behind the earlier ones of its lane, then start what may start."""
        self._held.setdefault(lane, deque()).append((message, policy))
        self.pump()

    def pump(self) -> None:
        """Start each lane's heads while the member is idle enough, or promoted by age."""
        now = self._clock_ms()
        progressed = True
        while progressed:
            progressed = False
            for lane, queue in list(self._held.items()):
                if not queue:
                    del self._held[lane]
                    continue
                message, policy = queue[0]
                in_use, limit = self._load()
                if now - message.timestamp_ms >= policy.promote_after_ms:
                    self.promoted += 1
                elif in_use >= policy.idle_below * limit:
                    continue
                queue.popleft()
                self.started += 1
                self._start(message)
                progressed = True

    def drop(self, partitions: Iterable[TopicPartition]) -> list[T]:
        """Forget held messages of revoked partitions; returns them."""
        wanted = set(partitions)
        dropped: list[T] = []
        for lane, queue in list(self._held.items()):
            kept = deque(entry for entry in queue if entry[0].tp not in wanted)
            dropped += [m for m, _ in queue if m.tp in wanted]
            if kept:
                self._held[lane] = kept
            else:
                del self._held[lane]
        return dropped
