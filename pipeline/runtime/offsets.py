"""Which offsets of a partition are done, and what position to commit.

The runtime finishes messages out of order (different keys run concurrently), so the committed
position is the lowest offset not yet done, and the offsets done above it travel in the commit
metadata, as Confluent's Parallel Consumer does. After a restart or rebalance the next owner reads
the metadata and skips what was already done instead of redoing it.

Metadata format: ``pl1:`` followed by comma-separated runs of offsets relative to the committed
position, ``a`` or ``a-b`` (inclusive), e.g. ``pl1:1-3,7`` for position + 1, 2, 3 and 7. It is
capped at :data:`MAX_METADATA_CHARS`; runs past the cap are left out, so those messages may run
again after a restart (at least once, never lost).
"""

from __future__ import annotations

import logging

from pipeline.envelope import Position, TopicPartition

log = logging.getLogger(__name__)

MAX_METADATA_CHARS = 4_000
_PREFIX = "pl1:"


def encode_done(position: int, done: list[int]) -> str:
    """Metadata for the sorted offsets ``done`` (all above ``position``)."""
    runs: list[str] = []
    size = len(_PREFIX)
    i = 0
    while i < len(done):
        j = i
        while j + 1 < len(done) and done[j + 1] == done[j] + 1:
            j += 1
        start, end = done[i] - position, done[j] - position
        run = f"{start}" if start == end else f"{start}-{end}"
        if size + len(run) + 1 > MAX_METADATA_CHARS:
            log.warning(
                "commit metadata full: %d done offsets above %d left out", len(done) - i, position
            )
            break
        runs.append(run)
        size += len(run) + 1
        i = j + 1
    return _PREFIX + ",".join(runs) if runs else ""


def decode_done(position: int, metadata: str) -> set[int]:
    """The offsets recorded as done above ``position``; unknown formats decode to none."""
    if not metadata.startswith(_PREFIX):
        return set()
    out: set[int] = set()
    for run in metadata[len(_PREFIX) :].split(","):
        if not run:
            continue
        try:
            start, _, end = run.partition("-")
            out.update(range(position + int(start), position + int(end or start) + 1))
        except ValueError:
            log.warning("ignoring malformed commit metadata run %r", run)
    return out


class PartitionOffsets:
    """Tracks one partition: offsets delivered and not yet done, and done ones above them."""

    __slots__ = ("_done", "_floor", "_next", "_pending", "_preloaded", "tp")

    def __init__(self, tp: TopicPartition, committed: Position | None = None) -> None:
        """Start from the group's committed position and its metadata, if any."""
        self.tp = tp
        self._floor = committed.offset if committed else 0
        self._preloaded = decode_done(self._floor, committed.metadata) if committed else set()
        self._pending: dict[int, None] = {}
        self._done: set[int] = set()
        self._next = self._floor  # one past the highest offset seen

    def already_done(self, offset: int) -> bool:
        """True if a previous owner recorded ``offset`` as done (the runtime skips it)."""
        return offset < self._floor or offset in self._preloaded

    def started(self, offset: int) -> None:
        """A message was delivered and will be processed."""
        self._pending[offset] = None
        if offset >= self._next:  # max() without the builtin's call, once a message
            self._next = offset + 1

    def skipped(self, offset: int) -> None:
        """A message was delivered but needs no processing (already done)."""
        self._done.add(offset)
        self._next = max(self._next, offset + 1)

    def finished(self, offset: int) -> None:
        """A started message is done."""
        if self._pending.pop(offset, 0) is None:
            self._done.add(offset)

    @property
    def in_flight(self) -> int:
        """Messages started and not yet done."""
        return len(self._pending)

    @property
    def done_ahead(self) -> int:
        """Messages done above the lowest one not done: finished, yet counted in the lag."""
        base = min(self._pending) if self._pending else self._next
        return sum(1 for o in self._done | self._preloaded if o > base)

    def position(self) -> Position:
        """What to commit: the lowest offset not done, with the done ones above it."""
        base = min(self._pending) if self._pending else self._next
        above = sorted(o for o in self._done | self._preloaded if o > base)
        # Done offsets below the commit point are forgotten: the commit covers them.
        self._done = {o for o in self._done if o > base}
        self._preloaded = {o for o in self._preloaded if o > base}
        return Position(self.tp, base, encode_done(base, above))
