"""Calls batched per turn of the event loop: what many tasks ask in one turn goes in one call.

A :class:`TurnBatcher` gathers the items its callers ask for during one turn of the loop and
sends them together (at most ``size`` in a call, at most ``depth`` calls in flight). Each
caller waits for its own answer, so it sees the latency of one round trip, while the process
pays for one call instead of one each. Under load a call carries many items: while calls are
in flight, the next items gather for the next call. The guard's starts
(:mod:`pipeline.runtime.starts`) and its ends on parked keys (:mod:`pipeline.runtime.ends`)
are sent this way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class TurnBatcher(Generic[T, R]):
    """Sends the items asked in one loop turn through ``call``, one answer per item, in order."""

    def __init__(
        self, call: Callable[[list[T]], Awaitable[list[R]]], *, depth: int = 2, size: int = 32
    ) -> None:
        """Batch through ``call`` (answers in the items' order), ``depth`` calls in flight."""
        self._call = call
        self.depth = depth
        self.size = size
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._calls: set[asyncio.Task[None]] = set()
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.calls = 0
        """Calls made so far (for tests and the benchmark)."""

    async def ask(self, item: T) -> R:
        """Send ``item`` with the others of this turn; its answer."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._waiting.append((item, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._send)  # the items asked in this turn of the loop join the call
        return await future

    async def drain(self) -> None:
        """Wait until no call is in flight."""
        while self._calls:
            await asyncio.wait(set(self._calls))

    def _send(self) -> None:
        """Send what gathered, unless ``depth`` calls are in flight (one returning sends it)."""
        self._scheduled = False
        while self._waiting and len(self._calls) < self.depth:
            batch, self._waiting = self._waiting[: self.size], self._waiting[self.size :]
            self.calls += 1
            assert self._loop is not None  # noqa: S101 - set by ask()
            self._calls.add(self._loop.create_task(self._run(batch)))

    async def _run(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._call([item for item, _ in batch])
        except BaseException as exc:  # a bug must reach the waiting callers, not hang them
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
        self._returned()  # after the results: their callers go on before the next call goes

    def _returned(self) -> None:
        """A call returned: the next one may go, in the next turn of the loop.

        By then the callers it just answered have gone on, and what they ask next joins what
        gathered meanwhile, instead of waiting for a call of its own.
        """
        task = asyncio.current_task()
        if task is not None:
            self._calls.discard(task)
        if self._waiting and not self._scheduled:
            self._scheduled = True
            assert self._loop is not None  # noqa: S101 - set by ask()
            self._loop.call_soon(self._send)
