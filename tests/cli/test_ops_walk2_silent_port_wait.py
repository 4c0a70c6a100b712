"""A Kafka bootstrap address that accepts but never answers costs one wait, not two.

``PIPELINE_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:6379`` (Redis's port) took ~7.8 s to its one
line: the 3 s metadata request, the 1 s listener probe (no answer to ApiVersions), then 3 s
more of the refused-login diagnosis, which listens to librdkafka for a SASL refusal or a closed
connection. An address that gave no Kafka answer to the listener probe cannot refuse a login
(the login comes after ApiVersions), so that diagnosis is not asked for any more; one that
answered as a broker's listener still gets it.
"""

from __future__ import annotations

import asyncio
import re
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from pipeline.cli.status_checks import reach_broker
from pipeline.config import Settings
from pipeline.errors import BrokerUnavailable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
PROBE_CLIENT = b"pipeline-probe"  # the listener probe's client id
# librdkafka words the same timeout two ways, depending on which of its timers fires first
# ("Failed while waiting for controller: Local: Timed out", "Timed out waiting for controller").
NOT_ANSWERING = re.compile(r"(?i)timed out.*controller|controller.*timed out")


@asynccontextmanager
async def _serving(handler: Handler) -> AsyncIterator[int]:
    """A TCP server on a free loopback port running ``handler`` per connection: its port."""
    writers: list[asyncio.StreamWriter] = []
    tasks: set[asyncio.Task[None]] = set()

    async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        task = asyncio.current_task()
        if task is not None:
            tasks.add(task)
        await handler(reader, writer)

    server = await asyncio.start_server(keep, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for writer in writers:
            writer.transport.abort()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


async def _broker_like(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer the listener probe's ApiVersions v0 as a broker's listener; say nothing else.

    librdkafka's own requests get no answer (a broker that serves no metadata): a made-up
    answer to them could fail one of librdkafka's assertions and abort the test process.
    """
    while True:
        try:
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            request = await reader.readexactly(size)
        except (asyncio.IncompleteReadError, OSError):
            return
        if not request.endswith(PROBE_CLIENT):
            continue
        (correlation,) = struct.unpack_from(">i", request, 4)
        body = struct.pack(">ihi", correlation, 0, 1) + struct.pack(">hhh", 3, 0, 12)
        writer.write(struct.pack(">i", len(body)) + body)


def _kafka_at(settings: Settings, servers: str) -> Settings:
    kafka = settings.kafka.model_copy(update={"bootstrap_servers": servers})
    return settings.model_copy(update={"transport": "kafka", "kafka": kafka})


async def test_a_port_that_speaks_no_kafka_is_not_asked_about_a_login(
    settings: Settings, redis_service: str
) -> None:
    """Redis's port: the not-answering line, and no second wait for a refused login."""
    del redis_service  # Redis listens there (or the test is skipped)
    with pytest.raises(BrokerUnavailable) as down:
        await reach_broker(_kafka_at(settings, "127.0.0.1:6379"))
    assert "cannot reach Kafka at 127.0.0.1:6379" in str(down.value)
    assert NOT_ANSWERING.search(str(down.value)), str(down.value)
    assert "start it (`make services`)" in str(down.value)
    assert down.value.diagnose is None


async def test_a_broker_listener_that_gives_no_metadata_is_still_asked(
    settings: Settings,
) -> None:
    """An address that answers ApiVersions as a broker: its login may be what was refused."""
    async with _serving(_broker_like) as port:
        with pytest.raises(BrokerUnavailable) as down:
            await reach_broker(_kafka_at(settings, f"127.0.0.1:{port}"))
    assert f"127.0.0.1:{port}" in str(down.value)
    assert down.value.diagnose is not None
