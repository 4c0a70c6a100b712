"""Arrival counts written once although a flush's reply was lost and the flush sent again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pipeline.capacity.history import MINUTES_PER_DAY, ArrivalHistory
from pipeline.capacity.recorder import ArrivalRecorder

DAY0 = 20_000
NOW_S = DAY0 * 86_400 + 600.0
MINUTE = DAY0 * MINUTES_PER_DAY + 10


class ReplyDropper:
    """A loopback relay to Redis that drops Redis's replies while :attr:`dropping`.

    Commands still pass: Redis applies a write whose answer never reaches the client (a reply
    lost to a stall or a network fault).
    """

    def __init__(self, host: str, port: int) -> None:
        """Relay to ``host:port`` once started."""
        self._target = (host, port)
        self.dropping = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        """Listen on a free loopback port; the URL of the relayed Redis."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/0"

    async def close(self) -> None:
        """Stop listening and close every relayed connection."""
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers += [writer, up_writer]
        for task in (
            asyncio.create_task(self._pump(reader, up_writer, replies=False)),
            asyncio.create_task(self._pump(up_reader, writer, replies=True)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, replies: bool
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read(65536):
                if replies and self.dropping:
                    continue
                sink.write(data)
                await sink.drain()
        sink.close()


@pytest.fixture
async def relayed(redis: Redis, unique: str) -> AsyncIterator[tuple[Redis, ReplyDropper, str]]:
    """A client through a :class:`ReplyDropper` (a 2 s socket timeout) and a key prefix."""
    kwargs = redis.connection_pool.connection_kwargs
    relay = ReplyDropper(kwargs.get("host", "127.0.0.1"), kwargs.get("port", 6379))
    url = await relay.start()
    # 2 s: long enough for a loaded machine's replies, short for the one that never comes
    client = Redis.from_url(url, db=kwargs.get("db", 0), socket_timeout=2.0)
    prefix = f"t{unique}"
    yield client, relay, prefix
    await client.aclose()
    await relay.close()
    found = [key async for key in redis.scan_iter(match=f"{{{prefix}:cap:*")]
    if found:
        await redis.delete(*found)


@pytest.mark.timeout(60)
async def test_a_flush_whose_reply_was_lost_is_not_counted_twice(
    redis: Redis, relayed: tuple[Redis, ReplyDropper, str]
) -> None:
    """Redis applies a flush whose reply is lost; sent again, it adds nothing more.

    The recorder keeps what a failed flush held and sends it again, which is right when Redis
    never saw it; when Redis applied it and only the reply was lost, the increments were
    applied on both sends (before: 15 arrivals read back as 20 or more).
    """
    client, relay, prefix = relayed
    recorder = ArrivalRecorder(ArrivalHistory(client, prefix), clock=lambda: NOW_S)
    recorder.add("messages", 10)
    await recorder.flush()
    recorder.add("messages", 5)
    relay.dropping = True
    await recorder.flush()  # applied by Redis, no reply: kept for the next flush
    relay.dropping = False
    assert (recorder.flushed, recorder.pending) == (10, 5)
    recorder.add("messages", 1)
    await recorder.flush()
    assert (recorder.flushed, recorder.pending, recorder.dropped) == (16, 0, 0)
    history = ArrivalHistory(redis, prefix)
    assert await history.windows("messages", [(MINUTE, MINUTE + 1)]) == [[16]]


async def test_writers_add_up_and_leave_no_flush_numbers_behind(redis: Redis, unique: str) -> None:
    """Two recorders flushing at once add up; their flush numbers are gone after the next flush."""
    prefix = f"t{unique}"
    first, second = (
        ArrivalRecorder(ArrivalHistory(redis, prefix), clock=lambda: NOW_S) for _ in range(2)
    )
    try:
        for count in (3, 4):
            first.add("messages", count)
            second.add("messages", count * 10)
            await asyncio.gather(first.flush(), second.flush(), first.flush())
        await asyncio.gather(first.flush(), second.flush())  # nothing new: forgets the numbers
        history = ArrivalHistory(redis, prefix)
        assert await history.windows("messages", [(MINUTE, MINUTE + 1)]) == [[77]]
        assert [key async for key in redis.scan_iter(match=f"{{{prefix}:cap:*:f:*")] == []
    finally:
        found = [key async for key in redis.scan_iter(match=f"{{{prefix}:cap:*")]
        if found:
            await redis.delete(*found)


async def test_unsent_flushes_drop_their_oldest_minutes_past_the_bound(
    monkeypatch: pytest.MonkeyPatch, unique: str
) -> None:
    """With Redis down, the oldest minutes of the flushes kept are dropped past MAX_PENDING."""
    monkeypatch.setattr("pipeline.capacity.recorder.MAX_PENDING", 3)
    broken = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    now = [NOW_S]
    recorder = ArrivalRecorder(ArrivalHistory(broken, f"t{unique}"), clock=lambda: now[0])
    try:
        for count in range(1, 6):  # one minute each: 1, 2, ..., 5 arrivals
            recorder.add("messages", count)
            await recorder.flush()
            now[0] += 60
    finally:
        await broken.aclose()
    assert (recorder.flushed, recorder.pending, recorder.dropped) == (0, 3 + 4 + 5, 1 + 2)
