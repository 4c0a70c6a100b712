"""Slots at the edge: bounded concurrent work, and a 503 with an honest Retry-After.

Each source has ``max_in_flight`` slots; a request holds one from before its body is read until
its answer, so memory and database load stay bounded whatever the offered load (P4). When the log
store cannot keep up, slots stay taken, and a request that cannot get one within
``queue_timeout_ms`` is shed: it is answered 503 at once, cheaply, instead of queueing behind
work its sender will time out on (the limit is on the wait, not the length, as in CoDel). The
Retry-After is how long the work ahead of it takes to drain at the measured completion rate
(a request the log store failed is no completion), measured over the time the source had work in
hand: an idle spell keeps the rate it last drained at, and before anything completed the answer
is :data:`COLD_START_RETRY_AFTER_S`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable

COLD_START_RETRY_AFTER_S = 2
"""The Retry-After of a source before any of its requests completed: no drain rate measured yet.

Grows with the time its work has waited, so a log store stalled from the start still answers longer.
"""


class DrainRate:
    """Completions per second of busy time, exponentially decaying (time constant ``tau_s``).

    Time counts only while work is in hand, between :meth:`busy` and :meth:`idle`: an idle spell
    keeps the rate last drained at instead of decaying it towards zero, while work that does not
    complete (a stalled log store) makes it fall. The estimate is corrected for the busy time seen
    so far, so it is the measured rate from the first completion on, not a rise from zero.
    """

    def __init__(self, tau_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        """Start idle, with nothing measured."""
        self._tau_s = tau_s
        self._clock = clock
        self._rate = 0.0
        self._busy_s = 0.0
        self._last: float | None = None  # None while idle
        self._measured = False

    def _elapsed_s(self, now: float) -> float:
        return 0.0 if self._last is None else now - self._last

    def _advance(self) -> None:
        now = self._clock()
        elapsed_s = self._elapsed_s(now)
        self._rate *= math.exp(-elapsed_s / self._tau_s)
        self._busy_s += elapsed_s
        if self._last is not None:
            self._last = now

    def busy(self) -> None:
        """Work is in hand from now on."""
        if self._last is None:
            self._last = self._clock()

    def idle(self) -> None:
        """No work in hand from now on: the rate holds until :meth:`busy`."""
        self._advance()
        self._last = None

    def record(self) -> None:
        """Count one completion now."""
        self._advance()
        self._rate += 1.0 / self._tau_s
        self._measured = True

    def busy_s(self) -> float:
        """Seconds with work in hand so far."""
        return self._busy_s + self._elapsed_s(self._clock())

    def per_s(self) -> float:
        """The current estimate, in completions per second; 0 before the first completion."""
        if not self._measured:
            return 0.0
        elapsed_s = self._elapsed_s(self._clock())
        seen = -math.expm1(-(self._busy_s + elapsed_s) / self._tau_s)
        if seen <= 0:
            return math.inf  # completions in no measurable busy time
        return self._rate * math.exp(-elapsed_s / self._tau_s) / seen


class SourceSlots:
    """Slots for one source: take one with :meth:`acquire`, give it back with :meth:`release`."""

    def __init__(
        self,
        max_in_flight: int,
        queue_timeout_ms: int,
        max_retry_after_s: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Create ``max_in_flight`` free slots."""
        self._capacity = max_in_flight
        self._free = max_in_flight
        self._timeout_s = queue_timeout_ms / 1000
        self._max_retry_after_s = max_retry_after_s
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._drain = DrainRate(clock=clock)

    @property
    def in_flight(self) -> int:
        """Slots taken now."""
        return self._capacity - self._free

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot now."""
        return len(self._waiters)

    async def acquire(self) -> bool:
        """Take a slot, waiting at most the queue timeout; False means shed the request."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            self._drain.busy()
            return True
        if self._timeout_s <= 0:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self._timeout_s):
                await waiter
        except TimeoutError:
            # True when the slot was handed over just as the wait ran out.
            return waiter.done() and not waiter.cancelled()
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(completed=False)  # handed a slot, then cancelled: pass it on
            raise
        finally:
            if not waiter.done():
                waiter.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return True

    def release(self, *, completed: bool = True) -> None:
        """Give a slot back, straight to the oldest waiter if there is one.

        ``completed`` is False for work that failed for want of the log store (or the payload
        store): it left the slot but did not drain, so it does not count in the drain rate.
        """
        if completed:
            self._drain.record()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
        if self._free == self._capacity:
            self._drain.idle()

    def retry_after_s(self) -> int:
        """Seconds for the work ahead to drain at the measured rate, between 1 and the maximum.

        Before anything completed: :data:`COLD_START_RETRY_AFTER_S`, or the time the work has
        waited if longer.
        """
        ahead = self.in_flight + self.waiting
        rate = self._drain.per_s()
        wait_s = max(COLD_START_RETRY_AFTER_S, self._drain.busy_s()) if rate <= 0 else ahead / rate
        return max(1, min(self._max_retry_after_s, math.ceil(wait_s)))
