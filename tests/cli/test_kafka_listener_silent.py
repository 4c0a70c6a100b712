"""A port that accepts but never answers is not called "not a Kafka broker's listener".

A hung, GC-paused or overloaded broker accepts a connection and says nothing; the listener
probe took that silence for "other" and ``pipeline topics list`` said something that is not a
broker listens there, check the listener: wrong advice for a broker that is there but stuck.
Silence is "unknown" now (the old not-answering line stands); "other" is kept for bytes that
are no Kafka response and for a connection closed right after it was accepted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from support import kafka_topics_list

from pipeline.cli.kafka_listener import listener_kind

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def _serving(handler: Handler) -> AsyncIterator[int]:
    """A TCP server on a free loopback port running ``handler`` per connection: its port."""
    connections: list[asyncio.StreamWriter] = []
    handlers: set[asyncio.Task[None]] = set()

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        task = asyncio.current_task()
        if task is not None:
            handlers.add(task)
        await handler(reader, writer)

    server = await asyncio.start_server(keep, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in connections:
            writer.transport.abort()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Accept, read whatever comes, answer nothing (a hung broker)."""
    del writer
    while await reader.read(4096):
        pass


async def _closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Accept and close at once, without a byte."""
    del reader
    writer.close()


async def test_a_silent_listener_is_unknown_not_other() -> None:
    """Accepted, the request read, no answer within the wait: unknown."""
    async with _serving(_silent) as port:
        assert await listener_kind("127.0.0.1", port, 0.5) == "unknown"


async def test_a_listener_that_closes_at_once_is_other() -> None:
    """Accepted and closed without a byte: no Kafka listener does that to ApiVersions v0."""
    async with _serving(_closing) as port:
        assert await listener_kind("127.0.0.1", port, 5.0) == "other"


async def test_a_silent_bootstrap_address_keeps_the_not_answering_line() -> None:
    """``pipeline topics list`` at a silent port: cannot reach Kafka, not 'check the listener'."""
    async with _serving(_silent) as port:
        result = await asyncio.to_thread(kafka_topics_list, f"127.0.0.1:{port}")
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: cannot reach Kafka at 127.0.0.1:{port}"), line
    assert "not a Kafka broker's listener" not in line, line
