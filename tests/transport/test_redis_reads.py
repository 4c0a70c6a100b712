"""Redis Streams reads whose reply never reaches the member: the entries are not lost.

``XREADGROUP`` moves the entries it reads into the member's pending list on the server whether
or not its reply arrives; a connection cut between the two (a network fault, a proxy, a reply
later than the socket timeout) must not leave them pending and never delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlparse

import pytest
from contract.helpers import make_topic

from pipeline.config import Settings
from pipeline.envelope import Message, Position
from pipeline.errors import BrokerUnavailable
from pipeline.transport.redis_streams.consumer import RedisStreamsConsumer
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

pytestmark = pytest.mark.usefixtures("redis_service")


class CuttingRelay:
    """A TCP relay to Redis that, once armed, cuts the connection of the next ``XREADGROUP``.

    The command reaches Redis, which runs it; its reply is not passed on and the member's
    connection is closed instead, as when the network fails between request and reply.
    """

    def __init__(self, host: str, port: int) -> None:
        """Relay to Redis at ``host:port`` once started."""
        self._target = (host, port)
        self.armed = False
        self.cut = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Listen on a free loopback port; returns it."""
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop listening and drop every relayed connection."""
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        server_r, server_w = await asyncio.open_connection(*self._target)
        cutting = False

        async def up() -> None:
            nonlocal cutting
            while data := await client_r.read(65536):
                if self.armed and b"XREADGROUP" in data:
                    self.armed, cutting = False, True
                server_w.write(data)
                await server_w.drain()

        async def down() -> None:
            while data := await server_r.read(65536):
                if cutting:  # Redis ran the read; its reply is lost with the connection
                    self.cut.set()
                    return
                client_w.write(data)
                await client_w.drain()

        try:
            await asyncio.wait(
                [asyncio.ensure_future(up()), asyncio.ensure_future(down())],
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for writer in (client_w, server_w):
                writer.transport.abort()
            self._tasks.discard(task)


@pytest.fixture
async def relay(settings: Settings) -> AsyncIterator[CuttingRelay]:
    """A cutting relay in front of the test Redis."""
    url = urlparse(settings.redis.url)
    r = CuttingRelay(url.hostname or "127.0.0.1", url.port or 6379)
    yield r
    await r.close()


async def poll_until(consumer: RedisStreamsConsumer, count: int) -> list[Message]:
    """Poll (committing each batch) until ``count`` messages came or a poll brings none."""
    got: list[Message] = []
    while len(got) < count:
        batch = await consumer.poll(500, 0.2)
        if not batch:
            break
        got += batch
        await consumer.commit([Position(batch[-1].tp, batch[-1].offset + 1)])
    return got


async def test_entries_of_a_read_whose_reply_was_lost_are_delivered(
    settings: Settings, relay: CuttingRelay, unique: str
) -> None:
    """Entries an XREADGROUP took whose reply was cut off come with the member's next polls."""
    direct = RedisStreamsTransport(settings)
    port = await relay.start()
    url = urlparse(settings.redis.url)
    redis = settings.redis.model_copy(
        update={"url": f"redis://127.0.0.1:{port}{url.path or '/0'}", "lease_ms": 30_000}
    )
    relayed = RedisStreamsTransport(settings.model_copy(update={"redis": redis}))
    topic = f"reads_{unique}"
    await make_topic(direct, topic, 1)
    producer = direct.producer()
    consumer = relayed.consumer(f"g-{unique}", [topic])
    try:
        for i in range(5):
            await producer.send(topic, b"%d" % i, key=b"k")
        first = await poll_until(consumer, 5)
        assert [m.offset for m in first] == [0, 1, 2, 3, 4]

        for i in range(5, 10):
            await producer.send(topic, b"%d" % i, key=b"k")
        relay.armed = True
        with contextlib.suppress(BrokerUnavailable):
            await consumer.poll(500, 0.2)
        assert relay.cut.is_set()

        for i in range(10, 15):
            await producer.send(topic, b"%d" % i, key=b"k")
        rest = await poll_until(consumer, 10)
        assert sorted(m.offset for m in rest) == list(range(5, 15))
    finally:
        await consumer.close()
        await producer.close()
        await relayed.close()
        await direct.admin().delete_group(f"g-{unique}", [topic])
        await direct.close()
