"""Batch lanes in a member: work that runs on idle capacity only, promoted near its SLA.

A lane with a ``batch:`` policy (``topics/*.yaml``) marks work nobody waits for: a nightly
re-index, a backfill. Its messages enter a :class:`BatchGate`, one FIFO per lane, before the key
lanes. The head of a lane's FIFO starts only while the member's handlers in use plus those
queued stay below ``idle_below`` of its concurrency limit, so interactive work always finds
room: batch work yields to it, and never makes a member look busy (the member leaves it out of
``pipeline_worker_slots_busy``, the autoscaler's signal). A message that has waited
``promote_at`` of its SLA since it was produced is promoted: it starts like interactive work,
whatever ``idle_below`` says, so it still completes in time. It takes turns with interactive
work rather than going ahead of it all: a promoted message starts while the handlers in use or
queued are below twice the limit (:data:`_PROMOTED_ROOM`), so a promoted backlog is queued one
limit's worth at a time, and an interactive message read meanwhile waits behind that much at
most.

A retry-tier copy (read from a tier, its ``pl-due-ms`` past: the chain says which are, a
``pl-due-ms`` on a main-topic message makes none) counts its wait from when
its event was first produced, not from when the copy was written: the SLA is the event's, so a
message promoted near it and failing once is not held for another ``promote_at`` of it.
Copies wait in a FIFO of their own ahead of the lane's fresh messages, as the key lanes put them
ahead of the keys waiting for a worker. A redriven or replayed message carries no due time: it
is new work, judged by its own production, and so are its copies: their clock starts at the
redrive (``pl-sla-from-ms``, :func:`~pipeline.headers.sla_from_ms`), not at the dead letter's
first production (``pl-produced-at-ms``, which a redrive keeps for cancellations), so a
redriven backlog failing once is not promoted ahead of interactive work all at once.

Held messages keep their partition's flow-control count, so a partition whose batch backlog
reaches the high-water mark is paused: the backlog stays in the broker, not in memory. Each
FIFO keeps per-key order (on an ordered lane a copy's key's later messages wait parked behind it,
as on any lane); a revoked partition's held messages are dropped (the next owner reads them
again).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic

from pipeline import headers as h
from pipeline.envelope import TopicPartition
from pipeline.runtime.work import T
from pipeline.topics.spec import BatchPolicy

_PROMOTED_ROOM = 2
"""Promoted work starts while the handlers in use or queued are below this many times the limit:
the key lanes run what is queued in turn, so a promoted backlog let in whole (up to
``partition_high_water`` a partition) would run before every interactive message read after it;
this way one limit's worth at most is queued ahead of them, and promoted work still gets its
turn between them."""

_Held = tuple[T, BatchPolicy, int]
"""A held message, its lane's policy and when its event was produced (ms since the epoch)."""


def _produced_ms(message: T, copy: bool) -> int:
    """When ``message``'s SLA clock started: a retry-tier copy's ``pl-sla-from-ms``, else its time.

    A copy's is the time of the delivery that failed first: its event's first production, or
    its last redrive or replay (never later than the copy's own time).
    """
    if not copy:
        return message.timestamp_ms
    return h.sla_from_ms(message.headers, message.timestamp_ms, topic=message.tp.topic)


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
        # Per lane: its retry copies, then its fresh messages; each a FIFO.
        self._held: dict[str, tuple[deque[_Held[T]], deque[_Held[T]]]] = {}
        self.started = 0
        self.promoted = 0

    @property
    def waiting(self) -> int:
        """Batch messages held back now."""
        return sum(len(c) + len(f) for c, f in self._held.values())

    @property
    def any_waiting(self) -> bool:
        """Whether a batch message is held back now (asked after every run: no sum)."""
        return bool(self._held)

    def waiting_in(self, lane: str) -> int:
        """Batch messages of ``lane`` held back now."""
        copies, fresh = self._held.get(lane, ((), ()))
        return len(copies) + len(fresh)

    def offer(
        self, message: T, lane: str, policy: BatchPolicy, *, copy: bool | None = None
    ) -> None:
        """Hold ``message`` behind the earlier ones of its lane, then start what may start.

        ``copy``: whether it is a retry-tier copy whose delay is over (the chain's due stage
        released it); None: whether it was read from a retry tier and carries ``pl-due-ms``
        (the chain's own rule: on a main topic the header means nothing).
        """
        if copy is None:
            copy = h.DUE_MS in message.headers and h.retry_tier(message.tp.topic)
        copies, fresh = self._held.setdefault(lane, (deque(), deque()))
        (copies if copy else fresh).append((message, policy, _produced_ms(message, copy)))
        self.pump()

    def pump(self) -> None:
        """Start each lane's heads while the member is idle enough, or promoted by age.

        A promoted head starts whether or not the other FIFO's head may: a copy past its
        promotion point is not held behind fresh work that is not, nor the other way round.
        """
        now = self._clock_ms()
        progressed = True
        while progressed:
            progressed = False
            for lane, (copies, fresh) in list(self._held.items()):
                if not copies and not fresh:
                    del self._held[lane]
                    continue
                queue = self._next(copies, fresh, now)
                if queue is None:
                    continue
                message, _, _ = queue.popleft()
                self.started += 1
                self._start(message)
                progressed = True

    def _next(
        self, copies: deque[_Held[T]], fresh: deque[_Held[T]], now: int
    ) -> deque[_Held[T]] | None:
        """The FIFO whose head starts now (promoted first, copies before fresh), or None."""
        heads = [queue for queue in (copies, fresh) if queue]
        in_use, limit = self._load()
        if in_use < _PROMOTED_ROOM * limit:
            for queue in heads:
                _, policy, produced = queue[0]
                if now - produced >= policy.promote_after_ms:
                    self.promoted += 1
                    return queue
        _, policy, _ = heads[0][0]
        return heads[0] if in_use < policy.idle_below * limit else None

    def drop(self, partitions: Iterable[TopicPartition]) -> list[T]:
        """Forget held messages of revoked partitions; returns them."""
        wanted = set(partitions)
        dropped: list[T] = []
        for lane, queues in list(self._held.items()):
            for queue in queues:
                kept = [entry for entry in queue if entry[0].tp not in wanted]
                dropped += [entry[0] for entry in queue if entry[0].tp in wanted]
                queue.clear()
                queue.extend(kept)
            if not any(queues):
                del self._held[lane]
        return dropped
