"""A full partition's messages sent away (FlowControl ``full``): counted apart, batch by batch.

The chain sends a flood's waiting messages away when their partition fills up; they no longer
count in its buffer, only in their batch until each is settled, and the partition sends no
second batch while one is in memory. The consumer here only records pauses and resumes (the
unit's other collaborator).
"""

from __future__ import annotations

from pipeline.envelope import TopicPartition
from pipeline.runtime.flow import FlowControl, PauseBook, SentAway

TP = TopicPartition("t", 0)


class _Consumer:
    """Records pauses and resumes."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.calls += ["pause"] * len(partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.calls += ["resume"] * len(partitions)


class _Spill:
    """The chain's side: sends ``size`` away each time (all it has, if fewer), records batches."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.batches: list[SentAway] = []
        self.asked: list[int] = []

    def __call__(self, _tp: TopicPartition, count: int, batch: SentAway) -> int:
        self.asked.append(count)
        self.batches.append(batch)
        return self.size


def _flow(spill: _Spill, consumer: _Consumer | None = None) -> FlowControl:
    return FlowControl(PauseBook(consumer or _Consumer()), 10, 5, full=spill)  # type: ignore[arg-type]


def test_a_batch_sent_before_a_revocation_counts_in_no_later_batch() -> None:
    """Revoked with a run of batch 1 still going, assigned back, batch 2 sent: 1's run ends.

    Counted in batch 2, it let batch 3 go while one of batch 2 was still in memory (5 of 6
    settled), and every later batch went one message early the same way.
    """
    spill = _Spill(6)
    flow = _flow(spill)
    for _ in range(10):
        flow.added(TP)
    first = spill.batches[0]
    flow.forget(TP)  # revoked; one message of the first batch still runs
    for _ in range(10):  # assigned back, full again
        flow.added(TP)
    second = spill.batches[1]
    flow.removed(TP, sent_away=first)  # the first batch's last run ends
    for _ in range(6):  # full again: the second batch is still in memory
        flow.added(TP)
    for _ in range(5):
        flow.removed(TP, sent_away=second)
    assert len(spill.batches) == 2  # one of the second batch not settled yet
    flow.removed(TP, sent_away=second)
    assert len(spill.batches) == 3
    third = spill.batches[2]
    for _ in range(5):
        flow.removed(TP, sent_away=third)
    for _ in range(6):  # full again while one of the third is in memory
        flow.added(TP)
    assert len(spill.batches) == 3


def test_a_spill_that_takes_it_below_low_water_neither_pauses_nor_resumes() -> None:
    """A key far larger than asked goes whole: the buffer is empty, the consumer never told.

    A pause and a resume at once made Kafka drop the partition's read-ahead and fetch it again.
    Full again while that batch is in memory, the partition pauses until it is settled.
    """
    consumer = _Consumer()
    spill = _Spill(10)
    flow = _flow(spill, consumer)
    for _ in range(10):
        flow.added(TP)
    assert spill.asked == [5]
    assert consumer.calls == []
    for _ in range(10):
        flow.added(TP)
    assert consumer.calls == ["pause"]
    assert spill.asked == [5]
    for _ in range(10):
        flow.removed(TP, sent_away=spill.batches[0])
    assert spill.asked == [5, 5]  # settled, still full: the next batch, to empty
    assert consumer.calls == ["pause", "resume"]
    for _ in range(9):  # what is buffered now counts from 0: no negative count
        flow.added(TP)
    assert consumer.calls == ["pause", "resume"]


def test_a_partition_paused_for_its_due_copies_stays_paused_through_a_spill() -> None:
    """Paused 'due' as well: filling, spilling and draining 'full' never resumes it."""
    consumer = _Consumer()
    pauses = PauseBook(consumer)  # type: ignore[arg-type]
    spill = _Spill(2)
    flow = FlowControl(pauses, 10, 5, full=spill)
    pauses.pause(TP, "due")
    for _ in range(10):
        flow.added(TP)  # 2 go, 8 left: paused full too
    for _ in range(2):
        flow.removed(TP, sent_away=spill.batches[0])  # the next 2 go: 6 left
    flow.removed(TP)  # 5: full no more
    assert consumer.calls == ["pause"]
    pauses.resume(TP, "due")
    assert consumer.calls == ["pause", "resume"]


def test_messages_sent_away_leave_the_buffer_one_batch_at_a_time() -> None:
    """A full partition's spilled messages stop counting at once; the next batch waits for them.

    Counted as buffered until each was written to Redis or its tier (one at a time per key),
    they kept a partition that had spilled paused for up to half a second more. Below its
    low-water mark once they went, the partition is not paused at all.
    """
    consumer = _Consumer()
    asked: list[int] = []
    batches: list[SentAway] = []

    def full(_tp: TopicPartition, count: int, batch: SentAway) -> int:
        asked.append(count)
        batches.append(batch)
        return 6

    tp = TopicPartition("t", 0)
    flow = FlowControl(PauseBook(consumer), 10, 5, full=full)  # type: ignore[arg-type]
    for _ in range(10):
        flow.added(tp)
    assert asked == [5]
    assert consumer.calls == []  # 4 left: below the low-water mark
    for _ in range(6):
        flow.added(tp)
    assert asked == [5]  # full again, but 6 are still on their way: no second batch yet
    assert consumer.calls == ["pause"]
    for _ in range(6):
        flow.removed(tp, sent_away=batches[0])
    assert asked == [5, 5]  # the batch written, still full: the next one goes
    assert consumer.calls == ["pause", "resume"]
