"""The scheduler of a debounced lane: woken by Redis, never polling; one runner per member process.

A :class:`TurnRunner` holds at most one timer, for the earliest due time it is responsible for,
and sleeps until it fires or something wakes it:

- its own ``step`` (one call that finishes the turns it ended and claims what is due) tells it
  the lane's next due time, and it takes the timer for it (Redis notes who holds it, so two
  runners do not keep firing together);
- a step that leased nothing while another runner holds that timer tells it when that runner's
  hold expires in Redis (a grace period after the due time), and it steps once more then: if
  the holder died it takes the timer over, and if the holder fired it finds it holding the next;
- a record that makes a turn due earlier than any runner's timer pushes that time onto the
  lane's wake list; each runner keeps one blocking read (``BLPOP``) on it on a connection of
  its own, and the runner it reaches arms its timer;
- its own process recording an earlier due time, or a busy slot freeing up, wakes it locally.

So an idle lane costs each runner one claim per ``poll_interval_ms`` (a watchdog against a
runner that died holding a timer no other runner was told of; Redis also forgets a timer a
grace period after it was due, and the next record then wakes another runner) and one renewed
blocking read per ten of them, and a due turn is claimed as soon as its timer fires. A runner
told of another's timer costs one step per hold it was told of, at most one per grace period;
none on an idle lane, which has no timer. Under load, steps are spaced at least
``batch_ms`` apart, so one call claims every turn that fell due in the meantime and finishes
the turns that ended; ended turns wait at most ``finish_delay_ms`` for a step to carry their
finish. A step that claims ``pass_at`` turns or more passes the timer to the next blocked
runner (Redis serves blocked readers in order), so a busy lane's turns spread over every
runner at the cost of one wake-up read per such step.

A runner whose timer fires while it has no free slot hands the timer to another runner through
the wake list (once; a runner woken that way keeps the timer until a slot frees).

While a callback runs its lease is renewed every third of ``lease_ms``; a renewal that finds
the turn taken over (this runner stalled past the lease, and a claim took the turn again)
cancels the callback, so a stalled runner does not run on beside the new holder's run or the
conversation's next turn. A renewal that finds the lease gone but not taken over (the state
gone with Redis's data, even if a new message of the conversation has been claimed as a new
turn since) lets it run on: its messages may be nowhere else. A callback that returns True
ends the turn; False or an exception keeps its messages and schedules the turn again after
``backoff(attempt)`` ms (the callback sees ``turn.attempt`` and dead-letters the turn itself once
it has had enough attempts, then returns True). A runner killed mid-turn loses nothing: the
lease runs out and another runner claims the turn again, its attempt raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from pipeline.admission.debounce.debouncer import Debouncer, DebounceStats, Ending, Step, Turn
from pipeline.admission.wake import dedicated_client
from pipeline.cancel_tasks import cancel_until_done, raise_absorbed_cancel
from pipeline.errors import DebounceUnavailable

__all__ = ["TurnRunner", "exponential_backoff_ms"]

log = logging.getLogger(__name__)

MAX_ENDINGS = 64
"""Ended turns that make a step at once, whatever ``finish_delay_ms`` says."""
OFFSET_KEEP_S = 10.0
"""How long the Redis clock offset from the fastest call is kept before any call replaces it."""


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
        poll_interval_ms: int = 15_000,
        error_backoff_ms: int = 500,
        backoff: Callable[[int], int] = exponential_backoff_ms,
        batch_ms: int = 10,
        finish_delay_ms: int = 20,
        pass_at: int = 6,
    ) -> None:
        """Run ``run_turn`` for each due turn of ``debouncer``'s lane.

        Args:
            debouncer: the lane's debouncer (this runner subscribes to its local records).
            run_turn: the callback; True when the turn succeeded.
            max_concurrency: turns running at once (of different keys).
            poll_interval_ms: the watchdog: the longest an idle runner goes without a claim
                (one claim per interval when nothing happens).
            error_backoff_ms: the sleep after Redis could not be reached.
            backoff: milliseconds before a failed turn (given its attempt) is due again.
            batch_ms: the shortest gap between two steps of this runner (under load one step
                claims everything due in the gap).
            finish_delay_ms: the longest an ended turn waits for a step to carry its finish.
            pass_at: a step that claims this many turns or more passes the lane's timer to
                the next blocked runner (0: never), spreading a busy lane over the runners.
        """
        self._debouncer = debouncer
        self._run_turn = run_turn
        self._max_concurrency = max_concurrency
        self._poll_s = poll_interval_ms / 1000
        self._error_backoff_s = error_backoff_ms / 1000
        self._backoff = backoff
        self._batch_s = batch_ms / 1000
        self._finish_delay_s = finish_delay_ms / 1000
        self._pass_at = pass_at
        self._running: set[asyncio.Task[None]] = set()
        self._calls: set[asyncio.Future[bool]] = set()  # the callbacks of the running turns
        self._wake = asyncio.Event()
        self._timer_ms = math.inf  # the due time (Redis clock) this runner holds a timer for
        self._timer_woken = False  # the timer came from the wake list (it is not handed on)
        self._backup_ms = math.inf  # when another runner's hold of the timer expires (Redis)
        self._woken_ms = math.inf  # the earliest due time woken for while a step is in flight
        self._retry_at = 0.0  # after a failed call, no step before this (monotonic s)
        self._offset_ms = 0.0  # Redis clock minus the local monotonic clock, in ms
        self._offset_rtt = math.inf  # round trip of the call the offset came from (s)
        self._offset_at = -math.inf  # when that call was made (monotonic s)
        self._last_step = -math.inf
        self._endings: list[tuple[Ending, asyncio.Future[None]]] = []
        self._flush_at = math.inf
        debouncer.subscribe(self._on_due)

    @property
    def stats(self) -> DebounceStats:
        """The debouncer's counters (turns, superseded, sizes, lateness, Redis calls, ...)."""
        return self._debouncer.stats

    @property
    def running(self) -> int:
        """Turns running now (a turn runs until its finish has reached Redis)."""
        return len(self._running)

    @property
    def limit(self) -> int:
        """Turns it runs at once at most."""
        return self._max_concurrency

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and run turns until ``stop`` is set, then wait for the running turns to end.

        Cancelled, it cancels the callbacks still running and waits for them (a turn cancelled
        so keeps its messages: its lease runs out and it runs again, its attempt raised).
        """
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: self._wake.set())
        listener = asyncio.create_task(self._listen())
        self._timer_ms = -math.inf  # the first step claims what is due and takes the timer
        try:
            while not stop.is_set():
                self._wake.clear()
                delay_s = await self._tick()
                if delay_s > 0 and not stop.is_set():
                    await self._sleep(delay_s)
            await self._drain()
        except asyncio.CancelledError:  # what still runs is cancelled, then waited for
            for call in self._calls:
                call.cancel()
            await self._drain()
            raise
        finally:
            stopping.cancel()
            await cancel_until_done(listener)  # its BLPOP's write may lose a first cancellation
            if self._running:
                await asyncio.gather(*self._running, return_exceptions=True)

    async def _sleep(self, delay_s: float) -> None:
        """Wait until woken or ``delay_s`` has passed.

        On Python 3.11 ``asyncio.wait_for`` drops a cancellation that lands as the runner is
        woken (CPython issue 86296): it is raised here all the same.
        """
        with raise_absorbed_cancel(), contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay_s)

    async def _drain(self) -> None:
        """Let the running turns end and finish them (their finishes go in steps of no claim).

        Its waits are under ``asyncio.timeout``: ``asyncio.wait_for`` on Python 3.11 drops a
        cancellation that lands as the runner is woken (CPython issue 86296).
        """
        while self._running or self._endings:
            self._wake.clear()
            if self._endings:
                await self._step(0)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._wake.wait()

    async def _tick(self) -> float:
        """Step, hand over or wait: return how long to sleep (s) before looking again."""
        now = time.monotonic()
        free = self._max_concurrency - len(self._running)
        if now < self._retry_at:
            return self._retry_at - now
        timer_at = self._local_s(self._timer_ms)
        backup_at = self._local_s(self._backup_ms)
        due_at = min(timer_at, backup_at)
        claim = free > 0 and (due_at <= now or now - self._last_step >= self._poll_s)
        flush = bool(self._endings) and (
            claim or now >= self._flush_at or len(self._endings) >= MAX_ENDINGS
        )
        if claim or flush:
            spaced_at = self._last_step + self._batch_s
            if now < spaced_at:
                return spaced_at - now
            await self._step(free if claim else 0)
            return 0.0
        if timer_at <= now and free <= 0 and not self._timer_woken:
            await self._hand_over()
            return 0.0
        wake_at = min(self._flush_at, self._last_step + self._poll_s)
        if free > 0:
            wake_at = min(wake_at, due_at)
        elif not self._timer_woken:  # a full runner wakes to hand its timer over
            wake_at = min(wake_at, timer_at)
        return max(wake_at - now, 0.0005)

    async def _step(self, limit: int) -> None:
        endings, self._endings = self._endings, []
        self._flush_at = math.inf
        sent = time.monotonic()
        self._last_step = sent
        self._woken_ms = math.inf
        try:
            endings_ = [ending for ending, _ in endings]
            step = await self._debouncer.step(limit, endings_, self._pass_at)
        except DebounceUnavailable as exc:
            # The leases run out and the turns run again: a duplicate, never a lost message.
            log.warning("debounce step failed on lane %s: %s", self._debouncer.lane, exc)
            for _, done in endings:
                done.set_result(None)
            self._retry_at = time.monotonic() + self._error_backoff_s
            self._timer_ms = -math.inf  # claim once Redis is back
            return
        except asyncio.CancelledError:  # the runner's stop: they go in the drain that follows
            self._endings = endings + self._endings
            raise
        for _, done in endings:
            done.set_result(None)
        self._clock(step, sent)
        if limit > 0:  # another runner holds the timer: step again once its hold expires
            # (None: the timer is this runner's, passed on, or there is none)
            self._backup_ms = math.inf if step.backup_ms is None else step.backup_ms
        if limit > 0 or step.timer_ms is not None:
            timer_ms = math.inf if step.timer_ms is None else step.timer_ms
            # A wake-up read while the step was in flight may be for a turn recorded after it.
            self._timer_ms = min(timer_ms, self._woken_ms)
            self._timer_woken = self._woken_ms < timer_ms
        for turn in step.turns:
            task = asyncio.create_task(self._run(turn))
            self._running.add(task)
            task.add_done_callback(self._ended)

    async def _hand_over(self) -> None:
        due_ms, self._timer_ms = self._timer_ms, math.inf
        try:
            await self._debouncer.wake(int(due_ms) if math.isfinite(due_ms) else 0)
        except DebounceUnavailable as exc:
            log.warning("debounce hand-over failed on lane %s: %s", self._debouncer.lane, exc)
            self._timer_ms = due_ms
            self._retry_at = time.monotonic() + self._error_backoff_s

    async def _listen(self) -> None:
        """Block on the lane's wake list; each due time read arms this runner's timer."""
        timeout_s = max(self._poll_s * 10, 0.01)  # bounded: a silently dead link is noticed
        client = self._debouncer.functions.client
        blocking: Redis | None = None
        if isinstance(client, Redis):  # a connection of its own, read timeout beyond the block
            blocking = dedicated_client(client, timeout_s + 5)
        try:
            await self._read_wakes(blocking or client, timeout_s)
        finally:
            if blocking is not None:
                await blocking.aclose()

    async def _read_wakes(self, client: Redis, timeout_s: float) -> None:
        while True:
            try:
                due_ms = await self._debouncer.wait_wake(client, timeout_s)
            except DebounceUnavailable as exc:
                lane = self._debouncer.lane
                log.warning("debounce wake list unreadable on lane %s: %s", lane, exc)
                self._timer_ms = -math.inf  # claim once Redis is back
                self._wake.set()
                await asyncio.sleep(self._error_backoff_s)
                continue
            if due_ms is not None:
                self._woken(due_ms)

    def _clock(self, step: Step, sent: float) -> None:
        """Track Redis time against the local clock (the call's midpoint is Redis's now).

        A call delayed by a busy machine has a long round trip and a midpoint that says little:
        the offset comes from the fastest call of the last ``OFFSET_KEEP_S``.
        """
        received = time.monotonic()
        rtt = received - sent
        if rtt <= self._offset_rtt or received - self._offset_at > OFFSET_KEEP_S:
            self._offset_ms = step.now_ms - (sent + received) * 500
            self._offset_rtt, self._offset_at = rtt, received

    def _local_s(self, due_ms: float) -> float:
        """The local monotonic time (s) at which Redis time ``due_ms`` arrives (+1 ms)."""
        if not math.isfinite(due_ms):
            return due_ms
        return (due_ms + 1 - self._offset_ms) / 1000

    def _on_due(self, due_ms: int) -> None:
        self._woken(due_ms)

    def _woken(self, due_ms: int) -> None:
        """Arm the timer for ``due_ms`` if it is earlier (and remember it across a step)."""
        self._woken_ms = min(self._woken_ms, due_ms)
        if due_ms < self._timer_ms:
            self._timer_ms = due_ms
            self._timer_woken = True
            self._wake.set()

    def _ended(self, task: asyncio.Task[None]) -> None:
        full = len(self._running) >= self._max_concurrency
        self._running.discard(task)
        if full:
            self._wake.set()

    async def _run(self, turn: Turn) -> None:
        call = asyncio.ensure_future(self._call(turn))
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)
        renew_s = self._debouncer.lease_ms / 3000
        while True:
            done, _ = await asyncio.wait({call}, timeout=renew_s)
            if done:
                break
            try:
                renewal = await self._debouncer.renew(turn)
            except DebounceUnavailable as exc:
                log.warning("debounce lease of %s not renewed: %s", turn.key, exc)
                continue
            if renewal == "taken":  # another runner has these messages: stop running them here
                log.warning(
                    "debounce lease of %s on lane %s lapsed and another runner took its turn "
                    "(this one stalled past lease_ms): the turn is stopped here",
                    turn.key,
                    turn.lane,
                )
                self._debouncer.stats.lost_leases += 1
                await cancel_until_done(call)
                return
            if renewal == "lost":
                log.warning("debounce lease of %s lost while its turn ran", turn.key)
        ok = call.result()
        retry_in_ms = 0 if ok else self._backoff(turn.attempt)
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._endings.append((Ending(turn.key, turn.token, ok, retry_in_ms), finished))
        self._flush_at = min(self._flush_at, time.monotonic() + self._finish_delay_s)
        self._wake.set()
        await finished

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
