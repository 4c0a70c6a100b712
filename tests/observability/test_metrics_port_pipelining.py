"""Requests pipelined on a metrics port by a client that does not read its answers.

:class:`~pipeline.observability.metrics_http.MetricsProtocol` answered each request the moment
its parser completed it, however many one read held: 450 ``GET /metrics`` sent at once on each
of 8 connections that read nothing took a member serving a 370 KB exposition from 65 MB to
1.35 GB of memory (every answer joined and held in the transport's buffer), where uvicorn
before it grew by 1.5 MB. 64 such connections would take about 10 GB. The tests show that such a
connection is closed once :data:`~pipeline.observability.metrics_http.MAX_WAITING` requests wait
behind answers it has not read, that answers it did get are whole and in order, and that a
client which pipelines a few requests and reads them gets every answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator

import httpx
from prometheus_client import Gauge
from support import serving_metrics

from pipeline.observability.metrics import Metrics
from pipeline.observability.metrics_http import MAX_WAITING
from pipeline.observability.server import MetricsServer

SERIES = 5_000  # an exposition of about 370 KB
SENT = 400  # requests pipelined in one write
_ANSWER = re.compile(rb"HTTP/1\.1 200 OK\r\n.*?content-length: (\d+)\r\n\r\n", re.DOTALL)


@contextlib.asynccontextmanager
async def _serving() -> AsyncIterator[tuple[int, MetricsServer]]:
    """:func:`serve_metrics` of a large exposition in this process, on a free port."""
    metrics = Metrics()
    gauge = Gauge("load_series", "Many series.", ["n", "pad"], registry=metrics.registry)
    for n in range(SERIES):
        gauge.labels(str(n), "x" * 40).set(n)
    server = MetricsServer(metrics, interval_s=3600)
    server.ready = True
    await server.refresh_once()
    async with serving_metrics(server) as port:
        yield port, server


def _answers(received: bytes, snapshot: bytes) -> int:
    """How many whole answers ``received`` holds, each checked to carry ``snapshot`` whole."""
    count, at = 0, 0
    while (match := _ANSWER.match(received, at)) is not None:
        length = int(match.group(1))
        body = received[match.end() : match.end() + length]
        if len(body) < length:
            break
        assert body == snapshot
        count, at = count + 1, match.end() + length
    return count


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    received = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(1 << 20), 20):
            received += chunk
    return received


async def test_a_client_that_pipelines_without_reading_is_closed_within_the_bound() -> None:
    """400 pipelined scrapes and no reads: closed, not 400 expositions held in memory."""
    request = b"GET /metrics HTTP/1.1\r\nHost: m\r\n\r\n"
    async with _serving() as (port, server):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request * SENT)
            await writer.drain()
            # The server reads those requests before it answers a probe sent after them.
            async with httpx.AsyncClient(timeout=20) as http:
                probe = (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code
            received = await _read_all(reader)  # now read: until the server closes it
        finally:
            writer.close()
        answered = _answers(received, server.snapshot)
    assert probe == 200
    assert answered < SENT, answered
    # Those in the socket's buffers when writing paused, and those waiting then.
    assert answered <= MAX_WAITING + 32, answered


async def test_a_client_that_pipelines_a_few_and_reads_gets_every_answer_in_order() -> None:
    """MAX_WAITING pipelined scrapes read as they come: each answered whole, none refused."""
    request = b"GET /metrics HTTP/1.1\r\nHost: m\r\n\r\n"
    last = b"GET /readyz HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n"
    async with _serving() as (port, server):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(request * (MAX_WAITING - 1) + last)
            received = await _read_all(reader)
        finally:
            writer.close()
        answered = _answers(received, server.snapshot)
    assert answered == MAX_WAITING - 1
    assert received.endswith(b"connection: close\r\n\r\nready\n")
