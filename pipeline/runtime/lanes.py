"""Key-level parallelism: per-key FIFO lanes served by a fixed pool of workers.

Messages of one key run one at a time, in the order they were submitted; messages of different
keys run concurrently, up to ``max_concurrency`` at once. A key is in the ready queue at most
once (queued or running), so no key can overtake itself, and a worker that finishes a message
puts its key back at the end of the ready queue, so a busy key cannot starve the others.
Unordered lanes give every message its own key. The cost does not grow with idle keys: a key
exists only while it has messages.

A message that only leaves the member (a throttled lane's deferral, sent through a retry tier
unrun) is *leaving* work: its key waits for a worker after the keys with work to run, though
one pick in :data:`LEAVING_EVERY` takes a leaving key while both wait. A flood's deferrals (a
produce and a Redis call each) would otherwise take the workers, in the order they came, from
other tenants' messages read after them; behind the runs alone, they would wait (buffered, their
partition paused full) for as long as the runs never ran out.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Generic

from pipeline.envelope import TopicPartition
from pipeline.runtime.work import T

log = logging.getLogger(__name__)

LaneKey = tuple[TopicPartition, Hashable]

LEAVING_EVERY = 4
"""While keys with work to run and leaving keys both wait, every so many picks of a worker
take a leaving key: deferrals give way to the runs, but never wait for them for ever."""


class KeyLanes(Generic[T]):
    """Runs submitted messages through ``process`` with per-key order and bounded concurrency."""

    def __init__(self, process: Callable[[T], Awaitable[None]], max_concurrency: int) -> None:
        """Start nothing yet; call :meth:`start` inside the event loop."""
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self._process = process
        self._max_concurrency = max_concurrency
        self._queues: dict[LaneKey, deque[T]] = {}
        self._ready: deque[LaneKey] = deque()  # keys with a message to run, in turn
        self._leaving: deque[LaneKey] = deque()  # keys whose head only leaves, after _ready's
        self._passed = 0  # ready keys picked since the last leaving key (see _next_key)
        self._idle: deque[asyncio.Future[None]] = deque()  # workers waiting for a ready key
        self._running: dict[LaneKey, T] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._changed = asyncio.Condition()
        self._idle_waiters = 0  # wait_idle callers; a finished message notifies only them
        self._limit = max_concurrency
        self._limit_raised = asyncio.Event()

    def start(self) -> None:
        """Start the worker pool."""
        self._workers = [
            asyncio.create_task(self._work(i), name=f"lane-worker-{i}")
            for i in range(self._max_concurrency)
        ]

    @property
    def limit(self) -> int:
        """Messages that may run at once now (at most ``max_concurrency``)."""
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        """Lower or raise the limit: above it, workers finish their message, then rest."""
        value = max(1, min(self._max_concurrency, value))
        if value > self._limit:
            self._limit_raised.set()
        self._limit = value

    def submit(
        self, message: T, *, ordered: bool, first: bool = False, leaving: bool = False
    ) -> None:
        """Queue ``message`` behind earlier messages of its key (or alone if not ordered).

        ``first``: a key that has nothing queued goes to the front of the keys waiting for a
        worker rather than the back (a retry copy whose delay is over: see :mod:`.chain`).
        ``leaving``: ``message`` only leaves the member (a deferral); a key that has nothing
        queued waits for a worker after the keys with work to run (see :meth:`_next_key`).
        """
        key: LaneKey = (message.tp, message.key if ordered else ("offset", message.offset))
        queue = self._queues.get(key)
        if queue is None:
            self._queues[key] = deque([message])
            self._make_ready(key, first=first, leaving=leaving)
        else:
            queue.append(message)

    @property
    def running(self) -> int:
        """Messages running now (busy worker slots)."""
        return len(self._running)

    def busy(self, message: T) -> bool:
        """Whether ``message``'s key has messages queued or running (ordered lanes)."""
        return (message.tp, message.key) in self._queues

    def queued_of(
        self, tp: TopicPartition, count: int, eligible: Callable[[T], bool], *, least: int
    ) -> list[T]:
        """About ``count`` messages of ``tp``'s longest keys that wait behind their key's head.

        Keys with ``least`` messages queued or more, the longest first, each whole: every message
        of the key that is queued (not running) and not ``eligible``-refused; a key with one
        refused is left out. The messages stay where they are, in order (the chain marks them
        to leave the member when their turn comes: :meth:`Chain.spill`).
        """
        keys = sorted(
            (key for key, queue in self._queues.items() if key[0] == tp and len(queue) >= least),
            key=lambda key: len(self._queues[key]),
            reverse=True,
        )
        out: list[T] = []
        for key in keys:
            if len(out) >= count:
                break
            queue = self._queues[key]
            waiting = list(queue)[1:] if key in self._running else list(queue)
            if waiting and all(eligible(message) for message in waiting):
                out += waiting
        return out

    @property
    def buffered(self) -> int:
        """Messages queued or running."""
        return sum(len(q) for q in self._queues.values())

    def running_on(self, partitions: Iterable[TopicPartition]) -> int:
        """Messages of these partitions running now."""
        wanted = set(partitions)
        return sum(1 for key in self._running if key[0] in wanted)

    def running_of(self, partitions: Iterable[TopicPartition]) -> list[T]:
        """The messages of these partitions running now."""
        wanted = set(partitions)
        return [message for key, message in self._running.items() if key[0] in wanted]

    def drop(self, partitions: Iterable[TopicPartition]) -> list[T]:
        """Forget queued (not running) messages of these partitions; returns them."""
        wanted = set(partitions)
        dropped: list[T] = []
        for key in [k for k in self._queues if k[0] in wanted]:
            queue = self._queues[key]
            if key in self._running:
                # Keep the running head; what follows it is dropped.
                dropped += list(queue)[1:]
                self._queues[key] = deque([queue[0]])
            else:
                dropped += queue
                del self._queues[key]
        # A key waiting for a worker leaves the ready queue with its messages: were they read
        # again (the partition assigned back), it would be queued twice and run by two workers.
        for ready in (self._ready, self._leaving):  # in place
            waiting = [key for key in ready if key in self._queues]
            if len(waiting) < len(ready):
                ready.clear()
                ready.extend(waiting)
        return dropped

    async def wait_idle(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Wait until nothing (of these partitions, if given) is running or queued."""
        wanted = None if partitions is None else set(partitions)
        self._idle_waiters += 1
        try:
            async with self._changed:
                await self._changed.wait_for(
                    lambda: not any(wanted is None or k[0] in wanted for k in self._queues)
                )
        finally:
            self._idle_waiters -= 1

    async def _work(self, index: int) -> None:
        task = asyncio.current_task()
        while True:
            if index >= self._limit:
                await self._rest(index)
            if not self._ready and not self._leaving:
                await self._wait_ready()
                continue  # the limit may have been lowered while this worker waited
            key = self._next_key()
            queue = self._queues.get(key)
            if not queue:  # dropped while waiting
                continue
            message = queue[0]
            self._running[key] = message
            try:
                await self._process(message)
            except Exception:
                log.exception(
                    "lane worker: unhandled error processing %s@%d", message.tp, message.offset
                )
            finally:
                del self._running[key]
                queue = self._queues.get(key)
                if queue is not None:
                    queue.popleft()
                    if queue:
                        self._make_ready(key)
                    else:
                        del self._queues[key]
                if self._idle_waiters:
                    async with self._changed:
                        self._changed.notify_all()
            if task is not None and task.cancelling():
                # close() asked this worker to stop while the message ran, and the request was
                # absorbed below it (asyncio.wait_for on Python 3.11, as redis-py writes: CPython
                # issue 86296); a stop a run takes back (LongWork) leaves no request behind.
                raise asyncio.CancelledError

    def _next_key(self) -> LaneKey:
        """The next key for a worker: a ready one, but a leaving one every LEAVING_EVERY picks.

        Behind the ready keys only, a deferral would wait as long as they never run out (steady
        load): its message buffered, its partition paused full for that long.
        """
        if self._leaving and (not self._ready or self._passed >= LEAVING_EVERY - 1):
            self._passed = 0
            return self._leaving.popleft()
        self._passed += 1
        return self._ready.popleft()

    async def _rest(self, index: int) -> None:
        """Wait while the limit is below this worker; a wake-up it had goes to another."""
        if self._ready or self._leaving:  # woken over the limit: one under it takes the work
            self._wake_one()
        while index >= self._limit:
            self._limit_raised.clear()
            await self._limit_raised.wait()

    def _make_ready(self, key: LaneKey, *, first: bool = False, leaving: bool = False) -> None:
        """Queue ``key`` for a worker and wake one waiting worker.

        At the front if ``first``; after every key with work to run if ``leaving``.
        """
        if leaving:
            self._leaving.append(key)
        elif first:
            self._ready.appendleft(key)
        else:
            self._ready.append(key)
        self._wake_one()

    async def _wait_ready(self) -> None:
        """Wait until a key may be ready (woken workers check: another may have taken it)."""
        waiter = asyncio.get_running_loop().create_future()
        self._idle.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and (self._ready or self._leaving):
                # Woken, then cancelled before running: the wake-up goes to the next worker.
                self._wake_one()
            raise

    def _wake_one(self) -> None:
        idle = self._idle
        while idle:
            waiter = idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self, timeout_s: float | None = None) -> list[T]:
        """Stop the workers (running messages are cancelled); return the runs left behind.

        A run whose handler swallows its cancellation would hold its worker for ever: after
        ``timeout_s`` such workers are left to themselves and their messages returned.
        """
        workers, self._workers = self._workers, []
        for task in workers:
            task.cancel()
        if workers:
            await asyncio.wait(workers, timeout=timeout_s)
        return list(self._running.values())
