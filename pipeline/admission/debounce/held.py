"""Which webhooks' events still wait in a debounced lane's buffers: asked by the ingress's sweeper.

A debounced lane's message waits in Redis for its turn with its offset committed, and a turn
may wait or run far longer than the sweeper's patience (a long turn, a failed turn's backoff,
busy runners). The sweeper asks, before it replays a webhook of such a lane, whether its event
is still buffered (``db_held``, one call per lane and batch of rows): a held event is going to
be processed, so its row is left to its turn instead of being replayed and, after
``max_replays``, abandoned.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from redis.asyncio import Redis

from pipeline.admission.debounce.codec import event_digest
from pipeline.admission.debounce.debouncer import GRACE_MS
from pipeline.admission.debounce.functions import DebounceFunctions
from pipeline.errors import DebounceUnavailable
from pipeline.redis_functions import FAILED


class BufferedEvents:
    """Asks the debouncer's Redis which events of its lanes still wait in a buffer."""

    def __init__(self, redis: Redis, prefix: str, lanes: Iterable[str]) -> None:
        """Ask ``redis`` (a client returning bytes, closed by :meth:`close`) about ``lanes``.

        ``prefix`` is the key prefix the members use (``Settings.redis.key_prefix``).
        """
        self._redis = redis
        self._functions = {
            lane: DebounceFunctions(redis, prefix, lane, owner="sweeper", grace_ms=GRACE_MS)
            for lane in lanes
        }

    def watches(self, lane: str) -> bool:
        """Whether ``lane`` is a debounced lane this asks about."""
        return lane in self._functions

    async def held(self, lane: str, event_ids: Sequence[str], keep_ms: int) -> set[str]:
        """The ids among ``event_ids`` whose message still waits in ``lane``'s buffers.

        Each one found stays findable ``keep_ms`` more.

        Raises:
            DebounceUnavailable: Redis cannot be reached.
        """
        functions = self._functions.get(lane)
        asked = [event_id for event_id in event_ids if event_id]
        if functions is None or not asked:
            return set()
        try:
            found = await functions.held([event_digest(e.encode()) for e in asked], keep_ms)
        except FAILED as exc:
            raise DebounceUnavailable(f"debounce on lane {lane}: {exc}") from exc
        return {event_id for event_id, held in zip(asked, found, strict=True) if held}

    async def close(self) -> None:
        """Close the Redis client."""
        await self._redis.aclose()
