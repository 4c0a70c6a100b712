"""A real ingress for the hostile-input tests: uvicorn with the project's settings on loopback.

The server is built by :func:`pipeline.ingress.service.build_ingress` and served by
:func:`pipeline.ingress.service.http_server` (httptools with the request-head cap) on a socket
bound before start, so a test connects at once and uvicorn accepts once its lifespan is done.
Events go to uuid-named Redis streams that are deleted afterwards; the sweeper is off.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from ingress.helpers import built_with_topics, one_lane_ingress

from pipeline.ingress.service import Ingress, http_server
from pipeline.transport import create_transport


@dataclass
class Running:
    """A listening ingress: its base URL, port and the built service (store, counters)."""

    url: str
    port: int
    built: Ingress
    topic: str


@asynccontextmanager
async def running_ingress(
    tmp_path: Path, sources: dict[str, Any], **ingress: Any
) -> AsyncIterator[Running]:
    """Serve ``sources`` (their ``topic`` is filled in) with ``ingress`` settings overrides."""
    topic = f"hostile-{uuid.uuid4().hex[:10]}"
    lane = {"name": topic, "partitions": 1, "lane": "hostile"}
    resolved = {name: {**config, "topic": topic} for name, config in sources.items()}
    schema = None
    if ingress.get("log_store") == "postgres":
        schema = f"t_{uuid.uuid4().hex[:12]}"
        ingress["postgres_schema"] = schema
    settings, config = one_lane_ingress(tmp_path, lane, resolved, **ingress)
    built = await built_with_topics(settings, config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until uvicorn has started
    port = sock.getsockname()[1]
    server = http_server(built, "127.0.0.1", port)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield Running(f"http://127.0.0.1:{port}", port, built, topic)
    finally:
        server.should_exit = True
        await serving
        sock.close()
        broker = create_transport(settings)
        try:
            await broker.admin().delete_topic(topic)
        finally:
            await broker.close()
        if schema is not None:
            async with await psycopg.AsyncConnection.connect(
                settings.postgres.url, autocommit=True
            ) as conn:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def raw_request(port: int, head: bytes, body: bytes = b"") -> bytes:
    """Send ``head`` (and ``body``) on a fresh connection; the first read of the answer.

    Enough for its status line (:func:`status_of`); a test that reads the body needs all of it.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        await writer.drain()
        return await reader.read(65_536)
    finally:
        writer.close()
        await writer.wait_closed()


def status_of(answer: bytes) -> int:
    """The status code of a raw HTTP answer (0 when the server closed without one)."""
    if not answer.startswith(b"HTTP/1.1 "):
        return 0
    return int(answer[9:12])
