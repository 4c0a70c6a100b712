"""Group commit: concurrent writers share one transaction, without waiting for a timer.

While one batch is being committed, new submissions queue up; the next batch takes all of them
(up to ``max_batch``). Under light load every row commits alone and at once; under heavy load a
commit (one fsync) covers many rows, so throughput is not bounded by one fsync per request and
no latency is added by a linger.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

Flush = Callable[[Sequence[T]], Awaitable[Sequence[R]]]
Committed = Callable[[int, float], None]
"""Told of each batch ``flush`` returned from: how many items it carried and its seconds."""


class Batcher(Generic[T, R]):
    """Feeds submitted items to ``flush`` in batches, one batch at a time, in submit order.

    ``flush(items)`` must return one result per item, in order. If a batch of several items
    raises an error that ``alone_when`` blames on the items (a value the store cannot encode),
    each item is flushed again alone, so one bad item fails only its own submitter, never the
    neighbours that shared its transaction (which committed nothing). Other errors (the store
    is down) fail the whole batch at once. A submitter that is cancelled does not cancel its
    item: the item is committed with its batch (on the ingress this means a row may exist for a
    request whose client went away, which the provider's redelivery then deduplicates).
    """

    def __init__(
        self,
        flush: Flush[T, R],
        max_batch: int = 512,
        *,
        alone_when: Callable[[Exception], bool] = lambda _: True,
    ) -> None:
        """Wrap ``flush``, giving it at most ``max_batch`` items per call."""
        self._flush = flush
        self._alone_when = alone_when
        self._max_batch = max_batch
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None
        self.committed: Committed | None = None
        """Told of every batch flushed without error (one call a batch, none per item)."""

    @property
    def pending(self) -> int:
        """Items submitted and not yet handed to ``flush``."""
        return len(self._pending)

    async def submit(self, item: T) -> R:
        """Queue ``item`` and wait for the result of the batch that carries it."""
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        # Not shielded: a cancelled submitter cancels only its future; the item is still flushed
        # with its batch (results are only set on futures that are not done).
        return await future

    async def drain(self) -> None:
        """Wait until every item submitted so far has been flushed."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        try:
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                await self._commit(batch)
        finally:
            self._task = None

    async def _commit(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        """Flush ``batch`` and settle its futures; on failure, each item alone."""
        started = time.perf_counter()
        try:
            results = await self._flush([item for item, _ in batch])
        except Exception as exc:
            if len(batch) > 1 and self._alone_when(exc):
                for one in batch:
                    await self._commit([one])
                return
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException:
            for _, future in batch:
                future.cancel()
            raise
        self._settle(batch, results, time.perf_counter() - started)

    def _settle(
        self, batch: list[tuple[T, asyncio.Future[R]]], results: Sequence[R], seconds: float
    ) -> None:
        """``batch`` was flushed in ``seconds``: tell the observer, then answer its submitters."""
        if self.committed is not None:
            self.committed(len(batch), seconds)
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
