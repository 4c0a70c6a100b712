"""The scheduler of a debounced lane: claims due turns and runs them, one per member process.

A :class:`TurnRunner` loops: one ``claim`` (up to its free concurrency) returns the due turns
and the lane's next due time; it runs each turn's callback in its own task and sleeps until the
next due time, but never longer than ``poll_interval_ms`` (another member may schedule an
earlier turn) and wakes at once when its own process records an earlier due time or a busy slot
frees up. Idle, it costs one Redis call per ``poll_interval_ms`` whatever the number of keys.

While a callback runs its lease is renewed every third of ``lease_ms``. A callback that returns
True ends the turn; False or an exception keeps its messages and schedules the turn again after
``backoff(attempt)`` ms (the callback sees ``turn.attempt`` and dead-letters the turn itself once
it has had enough attempts, then returns True).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable

from pipeline.admission.debounce import Debouncer, DebounceStats, Turn
from pipeline.errors import DebounceUnavailable

__all__ = ["TurnRunner", "exponential_backoff_ms"]

log = logging.getLogger(__name__)


def exponential_backoff_ms(attempt: int) -> int:
    """1 s after the first failed attempt, doubling, at most 60 s."""
    return int(min(60_000, 1_000 * 2 ** max(attempt - 1, 0)))


class TurnRunner:
    """Claims the due turns of one debounced lane and runs them, at most ``max_concurrency``."""

    def __init__(
        self,
        debouncer: Debouncer,
        run_turn: Callable[[Turn], Awaitable[bool]],
        *,
        max_concurrency: int = 16,
        poll_interval_ms: int = 50,
        error_backoff_ms: int = 500,
        backoff: Callable[[int], int] = exponential_backoff_ms,
    ) -> None:
        """Run ``run_turn`` for each due turn of ``debouncer``'s lane.

        Args:
            debouncer: the lane's debouncer (this runner subscribes to its local records).
            run_turn: the callback; True when the turn succeeded.
            max_concurrency: turns running at once (of different keys).
            poll_interval_ms: the longest sleep between claims.
            error_backoff_ms: the sleep after Redis could not be reached.
            backoff: milliseconds before a failed turn (given its attempt) is due again.
        """
        self._debouncer = debouncer
        self._run_turn = run_turn
        self._max_concurrency = max_concurrency
        self._poll_ms = poll_interval_ms
        self._error_backoff_ms = error_backoff_ms
        self._backoff = backoff
        self._running: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._planned_ms = math.inf
        debouncer.subscribe(self._on_record)

    @property
    def stats(self) -> DebounceStats:
        """The debouncer's counters (turns, superseded, sizes, lateness, Redis calls, ...)."""
        return self._debouncer.stats

    @property
    def running(self) -> int:
        """Turns running now."""
        return len(self._running)

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and run turns until ``stop`` is set, then wait for the running turns to end."""
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: self._wake.set())
        try:
            while not stop.is_set():
                self._wake.clear()
                delay_ms = await self._poll()
                if delay_ms > 0 and not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), delay_ms / 1000)
        finally:
            stopping.cancel()
            if self._running:
                await asyncio.gather(*self._running, return_exceptions=True)

    async def _poll(self) -> float:
        """Claim what is due into free slots; return how long to sleep (ms)."""
        free = self._max_concurrency - len(self._running)
        if free <= 0:
            self._planned_ms = math.inf  # a finishing turn wakes the loop
            return self._poll_ms
        try:
            claim = await self._debouncer.claim(free)
        except DebounceUnavailable as exc:
            log.warning("debounce claim failed on lane %s: %s", self._debouncer.lane, exc)
            self._planned_ms = math.inf
            return self._error_backoff_ms
        for turn in claim.turns:
            task = asyncio.create_task(self._run(turn))
            self._running.add(task)
            task.add_done_callback(self._ended)
        delay_ms: float = self._poll_ms
        if claim.next_due_ms is not None:
            delay_ms = min(delay_ms, max(claim.next_due_ms - claim.now_ms, 1))
        self._planned_ms = claim.now_ms + delay_ms
        return delay_ms

    def _on_record(self, due_ms: int) -> None:
        if due_ms < self._planned_ms:
            self._wake.set()

    def _ended(self, task: asyncio.Task[None]) -> None:
        full = len(self._running) >= self._max_concurrency
        self._running.discard(task)
        if full:
            self._wake.set()

    async def _run(self, turn: Turn) -> None:
        call = asyncio.ensure_future(self._call(turn))
        renew_s = self._debouncer.lease_ms / 3000
        while True:
            done, _ = await asyncio.wait({call}, timeout=renew_s)
            if done:
                break
            try:
                if not await self._debouncer.renew(turn):
                    log.warning("debounce lease of %s lost while its turn ran", turn.key)
            except DebounceUnavailable as exc:
                log.warning("debounce lease of %s not renewed: %s", turn.key, exc)
        ok = call.result()
        retry_in_ms = 0 if ok else self._backoff(turn.attempt)
        try:
            await self._debouncer.finish(turn, ok=ok, retry_in_ms=retry_in_ms)
        except DebounceUnavailable as exc:
            # The lease runs out and the turn runs again: a duplicate, never a lost message.
            log.warning("debounce turn of %s not finished, it will run again: %s", turn.key, exc)

    async def _call(self, turn: Turn) -> bool:
        try:
            return await self._run_turn(turn)
        except Exception:
            log.exception(
                "debounce turn of %s on lane %s failed (attempt %d)",
                turn.key,
                turn.lane,
                turn.attempt,
            )
            return False
