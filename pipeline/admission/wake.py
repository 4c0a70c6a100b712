"""The wake channel of one member: a blocking read of its Redis list of hand-over grants.

When a release by another member hands a slot to a waiter and that waiter now holds all its
keys, ``lua/throttle.lua`` pushes ``"HOLDER GRANT_MS"`` onto the waiter's member's list
(``LPUSH``); a hand-over to the releasing member's own waiters comes back in the release's reply
instead. One
:class:`WakeListener` per member process waits on that list with
`BLPOP <https://redis.io/commands/blpop/>`_ on a dedicated connection and hands each id to a
callback, so a waiting acquisition resumes as soon as Redis grants it, with no polling. The
block is bounded (``block_s``, a few seconds) so that a silently dead connection is noticed;
an empty block costs one idle round trip every ``block_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from redis.asyncio import ConnectionPool, Redis

from pipeline.redis_functions import FAILED

log = logging.getLogger(__name__)

_DRAIN = 256  # wake entries taken per LPOP after a BLPOP returned one
_RETRY_S = 0.5  # back-off before reconnecting after a Redis error, so an outage is not a spin


class WakeListener:
    """Reads one wake list until closed and calls ``on_wake(entry)`` for each entry."""

    def __init__(
        self, client: Redis, key: str, on_wake: Callable[[str], None], *, block_s: float
    ) -> None:
        """Wait on ``key`` through ``client`` (a connection of its own), ``block_s`` at a time."""
        self._client = client
        self._key = key
        self._on_wake = on_wake
        self._block_s = block_s
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.wakes = 0
        """Wake messages received."""
        self.errors = 0
        """Redis errors met while waiting (each followed by a short back-off)."""

    def start(self) -> None:
        """Start the background task (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"wake {self._key}")

    async def close(self) -> None:
        """Stop now (a pending ``BLPOP`` is abandoned) and close the dedicated connection."""
        self._stop.set()
        if self._task is not None:
            # The connection is closed right after, so an interrupted BLPOP leaves nothing behind.
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._client.aclose()

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = await self._client.blpop([self._key], timeout=self._block_s)
            except FAILED as exc:
                self.errors += 1
                log.warning("throttle wake channel %s unavailable: %s", self._key, exc)
                await _wait_or_stop(self._stop, _RETRY_S)
                continue
            if item is None:
                continue
            entries = [item[1]]
            try:  # drain what else arrived meanwhile in one more call, not one BLPOP each
                more = await self._client.lpop(self._key, _DRAIN)
                entries += more if isinstance(more, list) else []
            except FAILED:
                self.errors += 1
            for entry in entries:
                self.wakes += 1
                self._on_wake(entry.decode() if isinstance(entry, bytes) else str(entry))


async def _wait_or_stop(stop: asyncio.Event, delay_s: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), delay_s)
    except TimeoutError:
        return


def dedicated_client(client: Redis, socket_timeout_s: float) -> Redis:
    """A client with one connection of its own, for a blocking read; same server and auth."""
    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, "socket_timeout": socket_timeout_s}
    # from_pool: closing the client also closes this private pool.
    return Redis.from_pool(
        ConnectionPool(connection_class=pool.connection_class, max_connections=1, **kwargs)
    )
