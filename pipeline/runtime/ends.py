"""Ends on parked keys batched per turn of the event loop: one ``gd_end_many`` for many keys.

An end that parks a key, or leaves a parked key and releases its next followers, must be in
Redis before those followers run, so it cannot wait for the next commit the way ordinary ends
do (:mod:`pipeline.runtime.starts`). But when many keys' heads come due from their tier together
(a downstream outage ending), their ends and their followers' ends happen in the same turns of
the loop. An :class:`EndWindow` sends the ends made in one turn in one call; each waits for
that call and gets its own next followers, so every end is durable before the next message of
its key runs, as with one call each. The followers released to a member after one end run in
order, and their ends go together, with the next release, in one such call (``RunGuard``'s
release loop in :mod:`pipeline.runtime.guard`).
"""

from __future__ import annotations

import logging

from redis import exceptions as rexc

from pipeline.retry.guard_store import GuardStore, KeyEnds, Release
from pipeline.runtime.turnbatch import TurnBatcher

log = logging.getLogger(__name__)


class EndWindow:
    """Gathers one lane's ends on parked keys into batched ``gd_end_many`` calls."""

    def __init__(self, store: GuardStore) -> None:
        """Batch the parked-key ends of ``store``'s lane."""
        self._store = store
        self._batch: TurnBatcher[KeyEnds, list[Release] | None] = TurnBatcher(self._call)

    @property
    def calls(self) -> int:
        """Calls made so far (for tests and the benchmark)."""
        return self._batch.calls

    async def end(self, ends: KeyEnds) -> list[Release] | None:
        """Record how one key's starts ended, with the others of this turn; its next followers.

        Followers are released after the last end unless ``ends.release`` is False. None when
        Redis did not answer (logged): no follower is released here (their lease lapses and a
        reaper releases them), and the ends may still reach Redis later.
        """
        return await self._batch.ask(ends)

    async def _call(self, groups: list[KeyEnds]) -> list[list[Release] | None]:
        try:
            return list(await self._store.end_many(groups))
        except (rexc.RedisError, OSError) as exc:
            count = sum(len(group.ends) for group in groups)
            log.warning("parking unavailable, could not record %d ends: %s", count, exc)
            return [None] * len(groups)
