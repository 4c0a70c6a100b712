"""Starts batched per turn of the event loop: one guard call for many messages (P5).

Every message of a guarded lane asks the guard before it runs (``gd_begin``): is its key parked,
is it a suspect, a stale copy? Asked one by one, that is a Redis round trip per message. A
:class:`StartWindow` gathers the starts the member's workers make in one turn of the event loop
and sends them in one call, together with the ends recorded since the previous call; each start
waits for that call (its mark must be in Redis before its handler runs, or a crash in the
handler would go uncounted). Up to two calls are in flight at once: while they are, the next
starts gather for the next call, so under load a call carries many starts and a worker rarely
waits more than one round trip.
"""

from __future__ import annotations

import logging

from redis import exceptions as rexc

from pipeline.retry.guard_store import Decision, GuardStore, Start
from pipeline.runtime.turnbatch import TurnBatcher

log = logging.getLogger(__name__)
_KEPT_ENDS = 10_000
"""Ends kept for the next call while Redis cannot be reached (P4: bounded). An end dropped
past this leaves a start mark that expires with its hash; the message, if read again, runs
alone once."""


class StartWindow:
    """Gathers one lane's starts and ends into batched ``gd_begin`` calls."""

    depth = 2
    """Calls in flight at once."""
    size = 32
    """Starts in one call at most: the member's workers split over two calls, so while one is
    in flight the workers of the other run their handlers instead of all waiting together."""

    def __init__(self, store: GuardStore) -> None:
        """Batch the starts and ends of ``store``'s lane."""
        self._store = store
        self._ended: list[str] = []
        self._batch: TurnBatcher[Start, tuple[Decision, int]] = TurnBatcher(
            self._call, depth=self.depth, size=self.size
        )
        self._flushes = 0

    @property
    def calls(self) -> int:
        """Calls made so far (for tests and the benchmark)."""
        return self._batch.calls + self._flushes

    async def begin(self, start: Start) -> tuple[Decision, int]:
        """Record ``start`` with the others of this turn; its decision and start count."""
        return await self._batch.ask(start)

    def ended(self, start: Start, *, routed: bool = False) -> None:
        """``start`` ended as usual (handled, skipped, expired, dead-lettered, not parked).

        ``routed``: its route was recorded (``gd_route``) and its retry copy produced; its mark
        is left to that copy, so that a redelivery of this copy is stale.
        """
        self._ended.append(f"{start.end_line}\t1" if routed else start.end_line)

    async def flush(self) -> None:
        """Send the ends recorded so far (before a commit, so a committed message is ended)."""
        await self._batch.drain()
        if not self._ended:
            return
        ended, self._ended = self._ended, []
        try:
            self._flushes += 1
            await self._store.begin_many(ended, [])
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, could not end %d starts: %s", len(ended), exc)
            self._keep(ended)

    def _keep(self, ended: list[str]) -> None:
        """Put ends that could not be sent back before the newer ones, bounded (P4)."""
        self._ended = (ended + self._ended)[-_KEPT_ENDS:]

    async def _call(self, starts: list[Start]) -> list[tuple[Decision, int]]:
        """One ``gd_begin`` with the ends recorded so far; fails open if Redis cannot answer."""
        ended, self._ended = self._ended, []
        try:
            return await self._store.begin_many(ended, starts)
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, running %d messages without it: %s", len(starts), exc)
            self._keep(ended)
            return [("process", 0)] * len(starts)
