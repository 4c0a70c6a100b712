"""Arrival history per lane in Redis: per-minute counters, one fixed-size string per day.

Each lane has one key per UTC day holding 1440 unsigned 32-bit counters (5,760 bytes), written
with `BITFIELD INCRBY <https://redis.io/docs/latest/commands/bitfield/>`_ (saturating) and read
with `GETRANGE <https://redis.io/docs/latest/commands/getrange/>`_. A day key expires
``retention_days + 1`` days after its last write (at the latest just after its day ends), so a
lane costs at most ``5,760 x (retention_days + 2)`` bytes (about 173 kB for four weeks) however
busy it is. A day with no key is *missing* (before the
lane was recorded, or expired), which the forecast tells apart from a day of zero arrivals.

The recorder writes through :meth:`ArrivalHistory.add_once` (the ``cap_add`` function of
``lua/arrivals.lua``): each flush carries its writer's id and number, so a flush sent again after
Redis applied it and the reply was lost adds nothing twice.

Service times are kept beside them for the last :data:`SERVICE_WINDOW_MIN` minutes in a small
hash (finished count and handler seconds per minute), as the dynamic limits do per org.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.capacity import keys as k
from pipeline.redis_functions import FunctionLibrary, is_missing

__all__ = [
    "MINUTES_PER_DAY",
    "SERVICE_WINDOW_MIN",
    "ArrivalHistory",
    "Flush",
    "ServiceSample",
]

LIBRARY = resources.files("pipeline.capacity").joinpath("lua/arrivals.lua").read_text()

MINUTES_PER_DAY = 1440
_WIDTH = 4  # bytes per counter (u32)
SERVICE_WINDOW_MIN = 60
"""Minutes of service times kept and averaged."""
Flush = tuple[int, Mapping[tuple[str, int], int]]
"""A writer's flush: its number and the arrivals it adds per (lane, epoch minute)."""
SERVICE_TTL_MIN = SERVICE_WINDOW_MIN + 1
"""A lane's service-time hash expires this long after its last write."""


@dataclass(frozen=True, slots=True)
class ServiceSample:
    """Finished messages and their handler seconds over the service window."""

    count: int
    total_s: float

    @property
    def mean_s(self) -> float | None:
        """Mean service time in seconds (None: nothing finished in the window).

        None too for a mean that is no positive number (a hash written by something else):
        sized by it, a lane would need no slot at all.
        """
        if self.count <= 0 or not 0 < self.total_s < math.inf:
            return None
        return self.total_s / self.count


class ArrivalHistory:
    """Reads and writes one fleet's arrival counters (epoch minutes, UTC)."""

    def __init__(self, client: Redis, prefix: str, *, retention_days: int = 28) -> None:
        """Use ``client``; keys start with ``prefix``; days expire after ``retention_days``."""
        self._client = client
        self._prefix = prefix
        self._ttl_s = (retention_days + 1) * 86_400
        self._functions = FunctionLibrary(client, LIBRARY)

    async def add_once(
        self, writer: str, flushes: Sequence[Flush], *, settled: Mapping[str, Sequence[int]]
    ) -> None:
        """Add each of ``writer``'s ``flushes`` at most once, in one pipelined round trip.

        A flush whose reply was lost (Redis applied it, the caller saw a timeout) can be sent
        again under its number: Redis remembers the numbers it applied (``cap_add``) until the
        writer, having had the reply, lists them in ``settled`` (lane to flush numbers) with a
        later call. A writer's numbers must not repeat; its id is its own (a random one).
        """
        calls: list[tuple[list[str], list[str | int]]] = []
        for number, counts in flushes:
            lanes: dict[str, dict[int, list[tuple[int, int]]]] = {}
            for (lane, minute), count in counts.items():
                day, offset = divmod(minute, MINUTES_PER_DAY)
                lanes.setdefault(lane, {}).setdefault(day, []).append((offset, count))
            for lane, days in lanes.items():
                keys = [k.flushes(self._prefix, lane, writer)]
                args: list[str | int] = [self._ttl_s, number]
                for day, items in days.items():
                    keys.append(k.arrivals_day(self._prefix, lane, day))
                    args.append(len(items))
                    args += [value for item in items for value in item]
                calls.append((keys, args))
        forget = {lane: numbers for lane, numbers in settled.items() if numbers}
        if not calls and not forget:
            return
        await self._functions.ensure_loaded()
        try:
            await self._add_calls(writer, calls, forget)
        except rexc.ResponseError as exc:  # Redis lost the library: nothing was added
            if not is_missing(exc):
                raise
            await self._functions.load()
            await self._add_calls(writer, calls, forget)

    async def _add_calls(
        self,
        writer: str,
        calls: Sequence[tuple[list[str], list[str | int]]],
        forget: Mapping[str, Sequence[int]],
    ) -> None:
        function = self._functions.name("cap_add")
        async with self._client.pipeline(transaction=False) as pipe:
            for lane, numbers in forget.items():
                pipe.hdel(k.flushes(self._prefix, lane, writer), *map(str, numbers))
            for keys, args in calls:
                pipe.execute_command("FCALL", function, len(keys), *keys, *args)
            await pipe.execute()

    async def windows(self, lane: str, spans: Sequence[tuple[int, int]]) -> list[list[int] | None]:
        """Per-minute counts of each ``[start, end)`` epoch-minute span, in one round trip.

        A span is None when any day it touches has no key (not recorded, or expired).
        """
        reads: list[tuple[int, int, int]] = []  # (span index, first minute, last minute)
        for index, (start, end) in enumerate(spans):
            minute = start
            while minute < end:
                day = minute // MINUTES_PER_DAY
                last = min(end, (day + 1) * MINUTES_PER_DAY) - 1
                reads.append((index, minute, last))
                minute = last + 1
        async with self._client.pipeline(transaction=False) as pipe:
            for _, first, last in reads:
                day = first // MINUTES_PER_DAY
                key = k.arrivals_day(self._prefix, lane, day)
                begin = (first - day * MINUTES_PER_DAY) * _WIDTH
                pipe.getrange(key, begin, begin + (last - first + 1) * _WIDTH - 1)
            raw = await pipe.execute()
        out: list[list[int] | None] = [[] for _ in spans]
        for (index, first, last), data in zip(reads, raw, strict=True):
            current = out[index]
            if current is None:
                continue
            if len(data) != (last - first + 1) * _WIDTH:
                out[index] = None
                continue
            current.extend(
                int.from_bytes(data[i : i + _WIDTH], "big") for i in range(0, len(data), _WIDTH)
            )
        return out

    async def add_service(self, samples: Mapping[tuple[str, int], tuple[int, float]]) -> None:
        """Add (finished messages, handler seconds) per (lane, epoch minute) in one round trip."""
        if not samples:
            return
        async with self._client.pipeline(transaction=False) as pipe:
            for (lane, minute), (count, total_s) in samples.items():
                key = k.service(self._prefix, lane)
                pipe.hincrby(key, f"c:{minute}", count)
                pipe.hincrbyfloat(key, f"s:{minute}", total_s)
                # Every minute that left the window since the last write could have: the key
                # lives while writes come at most SERVICE_TTL_MIN apart, so a span that long
                # leaves no old minute behind (a narrower one leaked one per lull).
                stale = minute - SERVICE_WINDOW_MIN
                old = range(stale - SERVICE_TTL_MIN - 1, stale)
                pipe.hdel(key, *(f"{kind}:{m}" for m in old for kind in "cs"))
                pipe.expire(key, SERVICE_TTL_MIN * 60)
            await pipe.execute()

    async def service(self, lane: str, now_minute: int) -> ServiceSample:
        """Finished messages and handler seconds of the lane in the last window; one read.

        Only minutes holding both a count and seconds, each a number, are summed: the two are
        written together, so a minute with one alone (a write cut between them, or a field
        written by something else) would skew the mean.
        """
        fields = await self._client.hgetall(k.service(self._prefix, lane))
        counts: dict[str, int] = {}
        seconds: dict[str, float] = {}
        for raw_field, raw_value in fields.items():
            name = raw_field.decode() if isinstance(raw_field, bytes) else str(raw_field)
            kind, _, minute = name.partition(":")
            if not minute.isdigit() or int(minute) <= now_minute - SERVICE_WINDOW_MIN:
                continue
            try:
                if kind == "c":
                    counts[minute] = int(raw_value)
                elif kind == "s":
                    seconds[minute] = float(raw_value)
            except ValueError:
                continue
        both = counts.keys() & seconds.keys()
        count = sum(counts[minute] for minute in both)
        total_s = math.fsum(seconds[minute] for minute in both)
        return ServiceSample(count, total_s)
