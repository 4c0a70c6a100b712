"""Slots at the edge: bounded concurrent work, and a 503 with an honest Retry-After.

Each source has ``max_in_flight`` slots; a request holds one from before its body is read until
its answer, so memory and database load stay bounded whatever the offered load (P4). When the log
store cannot keep up, slots stay taken, and a request that cannot get one within
``queue_timeout_ms`` is shed: it is answered 503 at once, cheaply, instead of queueing behind
work its sender will time out on (the limit is on the wait, not the length, as in CoDel). The
Retry-After is how long the work ahead of it takes to drain at the measured completion rate.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable


class DrainRate:
    """Completions per second, as an exponentially decaying rate (time constant ``tau_s``)."""

    def __init__(self, tau_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        """Start at zero."""
        self._tau_s = tau_s
        self._clock = clock
        self._rate = 0.0
        self._last = clock()

    def _decayed(self, now: float) -> float:
        return self._rate * math.exp(-(now - self._last) / self._tau_s)

    def record(self) -> None:
        """Count one completion now."""
        now = self._clock()
        self._rate = self._decayed(now) + 1.0 / self._tau_s
        self._last = now

    def per_s(self) -> float:
        """The current estimate, in completions per second."""
        return self._decayed(self._clock())


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
                self.release()  # handed a slot, then cancelled: pass it on
            raise
        finally:
            if not waiter.done():
                waiter.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return True

    def release(self) -> None:
        """Give a slot back, straight to the oldest waiter if there is one."""
        self._drain.record()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    def retry_after_s(self) -> int:
        """Seconds for the work ahead to drain at the measured rate, between 1 and the maximum."""
        ahead = self.in_flight + self.waiting
        rate = self._drain.per_s()
        if rate <= 0:
            return self._max_retry_after_s
        return max(1, min(self._max_retry_after_s, math.ceil(ahead / rate)))
