"""One clock for the times one member writes and another judges: the Redis server's.

A retry copy's due time (``pl-due-ms``) is written by the member whose handler failed and judged
by whichever member reads the copy; a deadline or a ``max_age`` is counted from a time some other
host wrote. Read off each host's own clock, two hosts whose clocks disagree by 30 s run a copy
30 s early (a flapping dependency gets its retries at once) or 30 s late. A
:class:`SharedClock` reads Redis's ``TIME`` instead, as the guard's Lua does for liveness and
leases, without a round trip per reading: it keeps the offset between the server's clock and the
host's monotonic clock, measured before the member consumes anything and again every
:data:`REFRESH_S` (the smallest round trip of :data:`SAMPLES` calls, taking its midpoint, so the
reading is off by at most half that round trip). The monotonic clock is never stepped, so an NTP
correction of the host's wall clock between two measurements moves nothing.

Without Redis (a bare member, the in-memory testing transport) it is the host's clock,
``time.time``, and so it is until the first measurement succeeds. A failed measurement keeps the
last offset; it is logged once, and once more when Redis answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from redis.asyncio import Redis

from pipeline.redis_functions import FAILED

log = logging.getLogger(__name__)

REFRESH_S = 30.0
"""How often the offset to Redis's clock is measured again, in seconds."""
SAMPLES = 3
"""``TIME`` calls per measurement: the one with the smallest round trip is kept."""
_SKEW_WARN_MS = 1000
"""A host clock further than this from Redis's is logged (its other readers still disagree)."""


def local_ms() -> int:
    """The host's clock in ms since the epoch (``time.time``, looked up at every call)."""
    return int(time.time() * 1000)


class SharedClock:
    """Redis's ``TIME`` in ms since the epoch, read locally through a measured offset."""

    def __init__(self, redis: Redis | None = None, *, refresh_s: float = REFRESH_S) -> None:
        """Follow ``redis``'s clock (None: the host's); :meth:`measure` before the first use."""
        self._redis = redis
        self._refresh_s = refresh_s
        self._offset_ms: float | None = None
        """Redis's epoch ms less the host's monotonic ms; None until measured."""
        self.round_trip_ms: float | None = None
        """The round trip of the measurement in use."""
        self._failing = False

    def now_ms(self) -> int:
        """Now in ms since the epoch, by Redis's clock (the host's until it was measured)."""
        offset = self._offset_ms
        if offset is None:
            return local_ms()
        return int(time.monotonic() * 1000 + offset)

    async def measure(self) -> bool:
        """Measure the offset to Redis's clock; False (the last offset kept) if Redis failed."""
        if self._redis is None:
            return False
        try:
            best: tuple[float, float] | None = None
            for _ in range(SAMPLES):
                sent = time.monotonic()
                seconds, micros = await self._redis.time()
                back = time.monotonic()
                trip_ms = (back - sent) * 1000
                offset = int(seconds) * 1000 + int(micros) / 1000 - (sent + back) * 500
                if best is None or trip_ms < best[0]:
                    best = (trip_ms, offset)
        except (*FAILED, TimeoutError) as exc:
            if not self._failing:
                self._failing = True
                log.warning(
                    "could not read Redis's clock (%s); due times and deadlines keep %s",
                    exc,
                    "the last offset" if self._offset_ms is not None else "the host's clock",
                )
            return False
        assert best is not None  # noqa: S101 - SAMPLES >= 1
        if self._failing:
            self._failing = False
            log.info("Redis's clock is read again")
        first = self._offset_ms is None
        self.round_trip_ms, self._offset_ms = best
        if first:
            skew_ms = self.now_ms() - local_ms()
            if abs(skew_ms) > _SKEW_WARN_MS:
                log.warning(
                    "this host's clock is %+d ms off Redis's: retry due times and deadlines"
                    " follow Redis's (keep hosts in NTP sync for the rest)",
                    -skew_ms,
                )
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Measure again every ``refresh_s`` until ``stop`` is set (never raises Redis errors)."""
        if self._redis is None:
            return
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._refresh_s)
                return
            await self.measure()
