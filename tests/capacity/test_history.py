"""Arrival history in real Redis: bounded per-day counters, batched writes, missing days."""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from pipeline.capacity import keys as k
from pipeline.capacity.history import MINUTES_PER_DAY, ArrivalHistory
from pipeline.capacity.recorder import ArrivalRecorder, CountingProducer
from pipeline.envelope import Delivered, Record

DAY0 = 20_000  # a UTC day number (2024-10-04)


async def test_counts_round_trip_per_minute_across_midnight(redis: Redis, prefix: str) -> None:
    """Counts added per minute read back in order, across two day keys, zeros where none."""
    history = ArrivalHistory(redis, prefix)
    last = DAY0 * MINUTES_PER_DAY + MINUTES_PER_DAY - 1
    await history.add_once(
        "test", [(1, {("messages", last - 1): 5, ("messages", last): 7})], settled={}
    )
    await history.add_once(
        "test", [(2, {("messages", last): 1, ("messages", last + 1): 3})], settled={}
    )
    (window,) = await history.windows("messages", [(last - 2, last + 3)])
    assert window == [0, 5, 8, 3, 0]


async def test_a_day_key_is_fixed_size_and_expires_after_the_retention(
    redis: Redis, prefix: str
) -> None:
    """Each day is one 5,760-byte string that expires retention_days + 1 days out."""
    history = ArrivalHistory(redis, prefix, retention_days=7)
    await history.add_once("test", [(1, {("messages", DAY0 * MINUTES_PER_DAY + 3): 2})], settled={})
    key = k.arrivals_day(prefix, "messages", DAY0)
    assert await redis.strlen(key) == MINUTES_PER_DAY * 4
    assert 7 * 86_400 < await redis.ttl(key) <= 8 * 86_400


async def test_a_day_never_recorded_reads_as_missing(redis: Redis, prefix: str) -> None:
    """A window touching a day with no key is None, so the forecast leaves it out."""
    history = ArrivalHistory(redis, prefix)
    start = DAY0 * MINUTES_PER_DAY
    await history.add_once("test", [(1, {("messages", start): 1})], settled={})
    windows = await history.windows("messages", [(start, start + 2), (start - 5, start + 1)])
    assert windows == [[1, 0], None]


async def test_service_times_average_over_the_last_hour(redis: Redis, prefix: str) -> None:
    """Finished counts and handler seconds add up per minute; older minutes are ignored."""
    history = ArrivalHistory(redis, prefix)
    now = DAY0 * MINUTES_PER_DAY
    await history.add_service({("ai", now - 1): (10, 40.0), ("ai", now - 90): (5, 500.0)})
    await history.add_service({("ai", now - 1): (10, 20.0)})
    sample = await history.service("ai", now)
    assert (sample.count, sample.mean_s) == (20, 3.0)


async def test_minutes_out_of_the_window_are_deleted_whatever_the_gaps(
    redis: Redis, prefix: str
) -> None:
    """Writes 30 and 45 minutes apart still delete the minute that left the window.

    Each write deleted only the ten minutes just past the hour while refreshing the hash's
    expiry: on a lane with lulls of ten minutes to an hour, old minutes stayed for good.
    """
    history = ArrivalHistory(redis, prefix)
    now = DAY0 * MINUTES_PER_DAY
    for minute in (now, now + 30, now + 75):
        await history.add_service({("ai", minute): (1, 1.0)})
    fields = {f.decode() for f in await redis.hkeys(k.service(prefix, "ai"))}
    assert fields == {f"{kind}:{m}" for m in (now + 30, now + 75) for kind in "cs"}


class Clock:
    """A settable Unix clock."""

    def __init__(self, now_s: float) -> None:
        """Start at ``now_s``."""
        self.now_s = now_s

    def __call__(self) -> float:
        """The current time."""
        return self.now_s


class Inner:
    """A producer collaborator that acknowledges everything and counts its calls."""

    def __init__(self) -> None:
        """No batches yet."""
        self.batches = 0

    async def send(self, topic: str, value: bytes, **_: object) -> Delivered:
        """Acknowledge one message."""
        self.batches += 1
        return Delivered(topic, 0, len(value))

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Acknowledge a batch."""
        self.batches += 1
        return [Delivered(topic, 0, i) for i, _ in enumerate(records)]

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Nothing pending."""

    async def close(self) -> None:
        """Nothing to release."""


async def test_producer_batches_are_counted_in_memory_and_flushed_in_one_write(
    redis: Redis, prefix: str
) -> None:
    """Batches to lane topics count per lane and minute with no Redis call until the flush."""
    history = ArrivalHistory(redis, prefix)
    clock = Clock(DAY0 * 86_400 + 600.0)
    recorder = ArrivalRecorder(history, clock=clock)
    producer = CountingProducer(Inner(), recorder, {"messages": "messages", "ai": "ai_turns"})
    records = [Record(b"x", b"k", {})] * 3
    await producer.send_many("messages", records)
    await producer.send_many("messages.retry.5s", records)  # a retry tier: not an arrival
    await producer.send("ai", b"y")
    clock.now_s += 60
    await producer.send_many("messages", records[:2])
    minute = DAY0 * MINUTES_PER_DAY + 10
    assert await history.windows("messages", [(minute, minute + 2)]) == [None]
    await recorder.flush()
    assert await history.windows("messages", [(minute, minute + 2)]) == [[3, 2]]
    assert await history.windows("ai_turns", [(minute, minute + 1)]) == [[1]]
    assert recorder.flushed == 6
    recorder.served("messages", 4, 2.0)
    recorder.served("messages", 4, 6.0)
    await recorder.flush()
    assert (await history.service("messages", minute + 2)).mean_s == 1.0


async def test_counts_survive_a_failed_flush(prefix: str) -> None:
    """Counts a flush could not write stay pending for the next flush, nothing raised."""
    broken = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    recorder = ArrivalRecorder(ArrivalHistory(broken, prefix), clock=Clock(DAY0 * 86_400))
    try:
        recorder.add("messages", 4)
        await recorder.flush()
        recorder.add("messages", 1)
        await recorder.flush()
    finally:
        await broken.aclose()
    assert (recorder.flushed, recorder.pending, recorder.dropped) == (0, 5, 0)
