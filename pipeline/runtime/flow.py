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


class SentAway:
    """One batch of a full partition's messages sent away (:class:`FlowControl`).

    Each of its messages carries it (``Work.sent_away``) and is settled with it, once, so a
    batch sent before its partition was revoked and assigned back is told from the next
    owner's: its runs still going (past the revocation's wait, or lost) settle into it alone.
    """

    __slots__ = ("left",)

    def __init__(self) -> None:
        """A batch with nothing sent yet."""
        self.left = 0
        """Its messages not settled yet."""


class FlowControl:
    """Counts buffered messages per partition and pauses between the water marks.

    A partition that fills up may have messages *sent away* (``full``: a flood's waiting
    messages, on their way to a retry tier or to Redis behind a parked head). Those no longer
    count in its buffer, so it pauses only if it is still above its low-water mark after them
    (a pause and a resume at once would drop the client's read-ahead for nothing); they count
    apart, in their :class:`SentAway` batch, until each is settled, and while any does the
    partition sends no more away: at most one batch a partition is in memory beside its buffer
    (and, for a partition assigned back, the runs of an earlier batch still going).
    """

    def __init__(
        self,
        pauses: PauseBook,
        high_water: int,
        low_water: int,
        full: Callable[[TopicPartition, int, SentAway], int] | None = None,
    ) -> None:
        """Pause a partition above ``high_water`` buffered messages, resume at ``low_water``.

        ``full(tp, count, batch)`` is told when ``tp`` fills up (and again when its batch is
        settled while it is still paused full), with how many of its messages must go for it
        to read on; it returns how many it sent away (the chain sends a flood's waiting
        messages away), each marked with ``batch`` and settled later with
        ``removed(tp, sent_away=batch)``.
        """
        if not 0 <= low_water < high_water:
            raise ValueError(f"need 0 <= low_water < high_water, got {low_water}, {high_water}")
        self._pauses = pauses
        self._high = high_water
        self._low = low_water
        self._full = full
        self._buffered: Counter[TopicPartition] = Counter()
        self._away: dict[TopicPartition, SentAway] = {}  # the batch of each still in memory
        self._paused_full: set[TopicPartition] = set()

    def added(self, tp: TopicPartition) -> None:
        """One more message of ``tp`` is buffered."""
        buffered = self._buffered[tp] + 1  # one lookup and one store a message
        self._buffered[tp] = buffered
        if buffered == self._high:
            self._send_away(tp)
            if self._buffered[tp] > self._low:
                self._pauses.pause(tp, "full")
                self._paused_full.add(tp)

    def removed(self, tp: TopicPartition, *, sent_away: SentAway | None = None) -> None:
        """One message of ``tp`` is no longer in memory (``sent_away``: its batch, if sent away).

        One of a batch sent before ``tp`` was forgotten (revoked, perhaps assigned back since)
        counts in no buffer and no batch of ``tp``'s now.
        """
        if sent_away is not None:
            sent_away.left -= 1
            if sent_away.left <= 0 and self._away.get(tp) is sent_away:
                del self._away[tp]
                if tp in self._paused_full:  # still full: the next batch may go
                    self._send_away(tp)
            return
        buffered = self._buffered[tp] - 1  # one lookup and one store a message
        self._buffered[tp] = buffered
        if buffered == self._low:
            self._resume(tp)
        if buffered <= 0:
            del self._buffered[tp]

    def _send_away(self, tp: TopicPartition) -> None:
        if self._full is None or tp in self._away:
            return
        batch = SentAway()
        sent = self._full(tp, self._buffered[tp] - self._low, batch)
        if sent <= 0:
            return
        batch.left += sent
        self._away[tp] = batch
        self._buffered[tp] = max(0, self._buffered[tp] - sent)  # each of them was buffered
        if tp in self._paused_full and self._buffered[tp] <= self._low:
            self._resume(tp)

    def _resume(self, tp: TopicPartition) -> None:
        self._paused_full.discard(tp)
        self._pauses.resume(tp, "full")

    def forget(self, tp: TopicPartition) -> None:
        """The partition left this member (a batch of it still settling is told apart)."""
        self._buffered.pop(tp, None)
        self._away.pop(tp, None)
        self._paused_full.discard(tp)
