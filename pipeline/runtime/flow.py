"""Backpressure: partitions pause above a high-water mark of buffered messages.

They resume below a low-water mark, so memory stays bounded whatever the backlog on the broker.

A partition can be paused for several reasons at once (too many buffered messages, a retry-tier
message not yet due); it resumes only when the last reason is gone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Literal

from pipeline.envelope import TopicPartition
from pipeline.transport.protocol import Consumer

Reason = Literal["full", "due"]


class PauseBook:
    """Pauses and resumes partitions on a consumer by reason."""

    def __init__(self, consumer: Consumer) -> None:
        """Pause and resume through ``consumer``."""
        self._consumer = consumer
        self._reasons: dict[TopicPartition, set[Reason]] = {}

    def pause(self, tp: TopicPartition, reason: Reason) -> None:
        """Add ``reason``; pauses the partition if it was flowing."""
        reasons = self._reasons.setdefault(tp, set())
        if not reasons:
            self._consumer.pause([tp])
        reasons.add(reason)

    def resume(self, tp: TopicPartition, reason: Reason) -> None:
        """Remove ``reason``; resumes the partition when no reason is left."""
        reasons = self._reasons.get(tp)
        if reasons and reason in reasons:
            reasons.discard(reason)
            if not reasons:
                del self._reasons[tp]
                self._consumer.resume([tp])

    def forget(self, tp: TopicPartition) -> None:
        """The partition left this member: drop its reasons without calling the consumer."""
        self._reasons.pop(tp, None)


class FlowControl:
    """Counts buffered messages per partition and pauses between the water marks."""

    def __init__(
        self,
        pauses: PauseBook,
        high_water: int,
        low_water: int,
        full: Callable[[TopicPartition, int], None] | None = None,
    ) -> None:
        """Pause a partition above ``high_water`` buffered messages, resume at ``low_water``.

        ``full(tp, count)`` is told when ``tp`` pauses full, with how many of its messages
        must go for it to resume (the chain sends a flood's waiting messages away).
        """
        if not 0 <= low_water < high_water:
            raise ValueError(f"need 0 <= low_water < high_water, got {low_water}, {high_water}")
        self._pauses = pauses
        self._high = high_water
        self._low = low_water
        self._full = full
        self._buffered: Counter[TopicPartition] = Counter()

    def added(self, tp: TopicPartition) -> None:
        """One more message of ``tp`` is buffered."""
        self._buffered[tp] += 1
        if self._buffered[tp] == self._high:
            self._pauses.pause(tp, "full")
            if self._full is not None:
                self._full(tp, self._high - self._low)

    def removed(self, tp: TopicPartition) -> None:
        """One message of ``tp`` is no longer buffered."""
        self._buffered[tp] -= 1
        if self._buffered[tp] == self._low:
            self._pauses.resume(tp, "full")
        if self._buffered[tp] <= 0:
            del self._buffered[tp]

    def forget(self, tp: TopicPartition) -> None:
        """The partition left this member."""
        self._buffered.pop(tp, None)
