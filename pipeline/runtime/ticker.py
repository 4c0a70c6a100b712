"""Periodic work that expires at its cadence: a tick that waited past the next one is dropped.

A :class:`Ticker` produces a tick every ``every_s`` seconds, aligned to the clock (a tick at
each multiple of the cadence), fanned out into records by a function of the tick time. Every
record carries a ``pl-deadline-ms`` header of the *next* tick: if the lane is backed up and the
record has not started by then, the runtime drops it (counted and logged as expired) instead of
running stale work, since the next tick will do it with fresher data.

Several replicas may run the same ticker: each tick is claimed once across the fleet with one
Redis ``SET NX PX`` (``{prefix}:tick:{name}:{tick_ms}``), so it is produced once. Without Redis,
every replica produces it. With Redis the ticks follow Redis's clock
(:class:`~pipeline.runtime.shared_clock.SharedClock`, the one the members judge deadlines by),
so a replica whose host clock runs ahead neither produces ticks early nor stamps them with
deadlines the members read as far off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.errors import TransportError
from pipeline.runtime.keys import tick_key
from pipeline.runtime.shared_clock import REFRESH_S, SharedClock
from pipeline.transport.protocol import Producer

log = logging.getLogger(__name__)


class Ticker:
    """Produces the records of one periodic job to ``topic`` every ``every_s`` seconds."""

    def __init__(
        self,
        producer: Producer,
        topic: str,
        every_s: float,
        fan_out: Callable[[int], Iterable[Record]],
        *,
        name: str | None = None,
        redis: Redis | None = None,
        prefix: str = "pl",
        clock: Callable[[], float] | None = None,
    ) -> None:
        """Tick every ``every_s`` seconds; ``fan_out(tick_ms)`` gives the tick's records.

        ``clock`` (seconds since the epoch): by default Redis's clock when ``redis`` is given,
        else the host's.
        """
        if every_s <= 0:
            raise ValueError(f"every_s must be > 0, got {every_s}")
        self._producer = producer
        self._topic = topic
        self._every_ms = round(every_s * 1000)
        self._fan_out = fan_out
        self._name = name or topic
        self._redis = redis
        self._prefix = prefix
        self._shared = SharedClock(redis) if clock is None and redis is not None else None
        self._clock = clock or (self._shared_s if self._shared is not None else time.time)
        self._measured_at = -REFRESH_S
        """When (monotonic s) the shared clock was last measured."""
        self.ticks = 0
        self.produced = 0
        self.skipped = 0
        """Ticks another replica claimed first."""

    def _shared_s(self) -> float:
        assert self._shared is not None  # noqa: S101 - the clock only when there is one
        return self._shared.now_ms() / 1000

    async def _measure(self) -> None:
        """Measure Redis's clock again every :data:`REFRESH_S` (a failure keeps the last)."""
        if self._shared is not None and time.monotonic() - self._measured_at >= REFRESH_S:
            self._measured_at = time.monotonic()
            await self._shared.measure()

    def _next_tick_ms(self, now_ms: int) -> int:
        return (now_ms // self._every_ms + 1) * self._every_ms

    async def tick(self, tick_ms: int) -> int:
        """Produce the records of the tick at ``tick_ms`` (once across replicas); returns them."""
        if not await self._claim(tick_ms):
            self.skipped += 1
            return 0
        deadline = str(tick_ms + self._every_ms).encode()
        records = []
        for index, record in enumerate(self._fan_out(tick_ms)):
            headers = dict(record.headers or {})
            headers[h.DEADLINE_MS] = deadline
            headers.setdefault(h.EVENT_ID, f"{self._name}:{tick_ms}:{index}".encode())
            records.append(Record(record.value, record.key, headers))
        if records:
            await self._producer.send_many(self._topic, records)
        self.ticks += 1
        self.produced += len(records)
        return len(records)

    async def _claim(self, tick_ms: int) -> bool:
        if self._redis is None:
            return True
        key = tick_key(self._prefix, self._name, tick_ms)
        try:
            return bool(await self._redis.set(key, b"1", nx=True, px=self._every_ms * 10))
        except (RedisError, OSError) as exc:
            log.warning(
                "tick %s@%d not claimed (Redis: %s); producing it anyway", key, tick_ms, exc
            )
            return True

    async def run(self, stop: asyncio.Event) -> None:
        """Tick on every multiple of the cadence until ``stop`` is set."""
        while not stop.is_set():
            await self._measure()
            now_ms = int(self._clock() * 1000)
            tick_ms = self._next_tick_ms(now_ms)
            try:
                await asyncio.wait_for(stop.wait(), (tick_ms - now_ms) / 1000)
            except TimeoutError:
                pass
            else:
                return
            try:
                await self.tick(tick_ms)
            except TransportError as exc:  # the next tick will do the work
                log.warning("tick %s@%d not produced: %s", self._name, tick_ms, exc)
