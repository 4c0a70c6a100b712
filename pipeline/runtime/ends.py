"""Ends on parked keys batched per turn of the event loop: one ``gd_end_many`` for many keys.

An end that parks a key, leaves a parked key or releases its next follower must be in Redis
before that follower runs, so it cannot wait for the next commit the way ordinary ends do
(:mod:`pipeline.runtime.starts`). But when many keys' heads come due from their tier together
(a downstream outage ending), their ends and their followers' ends happen in the same turns of
the loop. An :class:`EndWindow` sends the ends made in one turn in one call; each waits for
that call and gets its own next follower, so every end is durable before the next message of
its key runs, as with one call each.
"""

from __future__ import annotations

import logging

from redis import exceptions as rexc

from pipeline.retry.guard_store import Ending, GuardStore, Release, Start
from pipeline.runtime.turnbatch import TurnBatcher

log = logging.getLogger(__name__)


class EndWindow:
    """Gathers one lane's ends on parked keys into batched ``gd_end_many`` calls."""

    def __init__(self, store: GuardStore) -> None:
        """Batch the parked-key ends of ``store``'s lane."""
        self._store = store
        self._batch: TurnBatcher[tuple[Start, Ending, bool], Release | None] = TurnBatcher(
            self._call
        )

    @property
    def calls(self) -> int:
        """Calls made so far (for tests and the benchmark)."""
        return self._batch.calls

    async def end(self, start: Start, ending: Ending, *, follow_dead: bool) -> Release | None:
        """Record how ``start`` ended, with the others of this turn; the key's next follower.

        ``follow_dead``: a dead-lettered head takes the followers parked behind it along.
        """
        return await self._batch.ask((start, ending, follow_dead))

    async def _call(self, ends: list[tuple[Start, Ending, bool]]) -> list[Release | None]:
        try:
            return await self._store.end_many(ends)
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, could not record %d ends: %s", len(ends), exc)
            return [None] * len(ends)
