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
    """Counts buffered messages per partition and pauses between the water marks.

    A partition that pauses full may have messages *sent away* (``full``: a flood's waiting
    messages, on their way to a retry tier or to Redis behind a parked head). Those no longer
    count in its buffer, so it can resume before they are written; they count apart until each
    is settled, and while any does the partition sends no more away: at most one batch a
    partition is in memory beside its buffer.
    """

    def __init__(
        self,
        pauses: PauseBook,
        high_water: int,
        low_water: int,
        full: Callable[[TopicPartition, int], int] | None = None,
    ) -> None:
        """Pause a partition above ``high_water`` buffered messages, resume at ``low_water``.

        ``full(tp, count)`` is told when ``tp`` pauses full, with how many of its messages
        must go for it to resume; it returns how many it sent away (the chain sends a flood's
        waiting messages away), each settled later with ``removed(tp, sent_away=True)``.
        """
        if not 0 <= low_water < high_water:
            raise ValueError(f"need 0 <= low_water < high_water, got {low_water}, {high_water}")
        self._pauses = pauses
        self._high = high_water
        self._low = low_water
        self._full = full
        self._buffered: Counter[TopicPartition] = Counter()
        self._away: Counter[TopicPartition] = Counter()
        self._paused_full: set[TopicPartition] = set()

    def added(self, tp: TopicPartition) -> None:
        """One more message of ``tp`` is buffered."""
        self._buffered[tp] += 1
        if self._buffered[tp] == self._high:
            self._pauses.pause(tp, "full")
            self._paused_full.add(tp)
            self._send_away(tp)

    def removed(self, tp: TopicPartition, *, sent_away: bool = False) -> None:
        """One message of ``tp`` is no longer in memory (``sent_away``: one of those sent away)."""
        if sent_away:
            self._away[tp] -= 1
            if self._away[tp] <= 0:
                del self._away[tp]
                if tp in self._paused_full:  # still full: the next batch may go
                    self._send_away(tp)
            return
        self._buffered[tp] -= 1
        if self._buffered[tp] == self._low:
            self._resume(tp)
        if self._buffered[tp] <= 0:
            del self._buffered[tp]

    def _send_away(self, tp: TopicPartition) -> None:
        if self._full is None or self._away[tp] > 0:
            return
        sent = self._full(tp, self._buffered[tp] - self._low)
        if sent <= 0:
            return
        before = self._buffered[tp]
        self._buffered[tp] = before - sent
        self._away[tp] += sent
        if before > self._low >= self._buffered[tp]:
            self._resume(tp)

    def _resume(self, tp: TopicPartition) -> None:
        self._paused_full.discard(tp)
        self._pauses.resume(tp, "full")

    def forget(self, tp: TopicPartition) -> None:
        """The partition left this member."""
        self._buffered.pop(tp, None)
        self._away.pop(tp, None)
        self._paused_full.discard(tp)
