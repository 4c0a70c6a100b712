"""Commit positions and completed-offset metadata."""

from __future__ import annotations

from pipeline.envelope import Position, TopicPartition
from pipeline.runtime.offsets import MAX_METADATA_CHARS, PartitionOffsets, decode_done, encode_done

TP = TopicPartition("t", 0)


def test_position_is_the_lowest_unfinished_offset_with_done_ones_above() -> None:
    """Out-of-order completion commits below the gap and records what is done above it."""
    offsets = PartitionOffsets(TP)
    for o in range(10):
        offsets.started(o)
    for o in (0, 1, 3, 4, 5, 8):
        offsets.finished(o)
    position = offsets.position()
    assert position.offset == 2
    assert decode_done(2, position.metadata) == {3, 4, 5, 8}
    assert position.metadata == "pl1:1-3,6"


def test_everything_done_commits_past_the_highest_offset() -> None:
    """With nothing in flight the position is one past the highest offset seen."""
    offsets = PartitionOffsets(TP, Position(TP, 5))
    for o in (5, 6, 9):  # 7 and 8 do not exist (compaction, transaction markers)
        offsets.started(o)
        offsets.finished(o)
    assert offsets.position() == Position(TP, 10, "")


def test_a_new_owner_skips_what_the_metadata_records_as_done() -> None:
    """Offsets recorded as done by the previous owner are skipped, the others are not."""
    previous = PartitionOffsets(TP)
    for o in range(6):
        previous.started(o)
    for o in (0, 2, 4):
        previous.finished(o)
    committed = previous.position()
    successor = PartitionOffsets(TP, committed)
    assert [o for o in range(6) if successor.already_done(o)] == [0, 2, 4]
    for o in (1, 3, 5):
        successor.started(o)
    successor.skipped(2)
    successor.skipped(4)
    assert successor.position().offset == 1
    for o in (1, 3, 5):
        successor.finished(o)
    assert successor.position() == Position(TP, 6, "")


def test_metadata_is_capped_and_never_claims_more_than_done() -> None:
    """A huge scatter of done offsets is truncated, never over-reported."""
    done = list(range(1, 40_000, 2))
    metadata = encode_done(0, done)
    assert len(metadata) <= MAX_METADATA_CHARS
    decoded = decode_done(0, metadata)
    assert decoded
    assert decoded <= set(done)


def test_foreign_or_malformed_metadata_decodes_to_nothing() -> None:
    """Metadata written by another tool is ignored, not misread."""
    assert decode_done(10, "some other consumer's note") == set()
    assert decode_done(10, "pl1:x-y,2") == {12}
