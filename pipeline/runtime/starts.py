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

import asyncio
import logging

from redis import exceptions as rexc

from pipeline.retry.guard_store import Decision, GuardStore, Start

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
        self._waiting: list[tuple[Start, asyncio.Future[tuple[Decision, int]]]] = []
        self._ended: list[str] = []
        self._calls: set[asyncio.Task[None]] = set()
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.calls = 0
        """Calls made so far (for tests and the benchmark)."""

    async def begin(self, start: Start) -> tuple[Decision, int]:
        """Record ``start`` with the others of this turn; its decision and start count."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[Decision, int]] = loop.create_future()
        self._waiting.append((start, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._send)  # the starts made in this turn of the loop join the call
        return await future

    def ended(self, start: Start) -> None:
        """``start`` ended as usual (handled, skipped, expired, dead-lettered, not parked)."""
        self._ended.append(start.end_line)

    async def flush(self) -> None:
        """Send the ends recorded so far (before a commit, so a committed message is ended)."""
        while self._calls:
            await asyncio.wait(set(self._calls))
        if not self._ended:
            return
        ended, self._ended = self._ended, []
        try:
            self.calls += 1
            await self._store.begin_many(ended, [])
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, could not end %d starts: %s", len(ended), exc)
            self._keep(ended)

    def _keep(self, ended: list[str]) -> None:
        """Put ends that could not be sent back before the newer ones, bounded (P4)."""
        self._ended = (ended + self._ended)[-_KEPT_ENDS:]

    def _send(self) -> None:
        """Send what gathered, unless ``depth`` calls are in flight (one returning sends it)."""
        self._scheduled = False
        while self._waiting and len(self._calls) < self.depth:
            batch, self._waiting = self._waiting[: self.size], self._waiting[self.size :]
            ended, self._ended = self._ended, []
            self.calls += 1
            assert self._loop is not None  # noqa: S101 - set by begin()
            self._calls.add(self._loop.create_task(self._call(batch, ended)))

    async def _call(
        self, batch: list[tuple[Start, asyncio.Future[tuple[Decision, int]]]], ended: list[str]
    ) -> None:
        try:
            results = await self._store.begin_many(ended, [start for start, _ in batch])
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, running %d messages without it: %s", len(batch), exc)
            self._keep(ended)
            results = [("process", 0)] * len(batch)
        except BaseException as exc:  # a bug must reach the waiting runs, not hang them
            self._returned()
            for _, future in batch:
                if future.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
            raise
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
        self._returned()  # after the results: their runs start before the next call goes

    def _returned(self) -> None:
        """A call returned: the next one may go, in the next turn of the loop.

        By then the runs it just decided have started, and the next starts of their workers
        join what gathered meanwhile, instead of waiting for a call of their own.
        """
        task = asyncio.current_task()
        if task is not None:
            self._calls.discard(task)
        if self._waiting and not self._scheduled:
            self._scheduled = True
            assert self._loop is not None  # noqa: S101 - set by begin()
            self._loop.call_soon(self._send)
