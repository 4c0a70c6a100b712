"""A library load whose caller was cancelled, and which then failed, is not an orphan error.

A member stopped while its first call still loaded the guard's library (Redis accepting but not
answering yet) left the load running; when it then failed, nobody read its error, and asyncio
logged "Task exception was never retrieved" with a traceback once the task was collected (seen
in a run of the suite, attributed to whichever test ran then).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from pipeline.redis_functions import FunctionLibrary

SOURCE = (
    "#!lua name=pipeline_cancelled_load\n"
    "redis.register_function('cl_ping', function() return 1 end)\n"
)


@asynccontextmanager
async def _silent() -> AsyncIterator[tuple[int, asyncio.Event, list[asyncio.StreamWriter]]]:
    """A loopback port that accepts and says nothing.

    Yields its port, an event set at the first connection, and the connections (the caller
    aborts them to fail what waits on them).
    """
    accepted = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        accepted.set()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], accepted, writers
    finally:
        server.close()
        for writer in writers:
            writer.transport.abort()
        await server.wait_closed()


async def test_a_load_failing_after_its_caller_was_cancelled_leaves_no_unread_error() -> None:
    """The caller is cancelled while the load waits; the load then fails: read, and retried."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        async with _silent() as (port, accepted, writers):
            client = Redis(
                host="127.0.0.1", port=port, socket_timeout=30, retry=Retry(NoBackoff(), 0)
            )
            library = FunctionLibrary(client, SOURCE)
            call = asyncio.create_task(library.fcall("cl_ping", [], []))
            await accepted.wait()  # the load is on its way, unanswered
            loading = library._loading
            assert loading is not None
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            for writer in writers:
                writer.transport.abort()  # the load now fails: its connection is gone
            await asyncio.wait([loading])  # (reads nothing of its outcome)
            await asyncio.sleep(0)  # its done callbacks run
            assert library._loading is None  # a failed load is tried again by the next call
            del loading
            await client.aclose()
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert not [c for c in reported if "never retrieved" in str(c.get("message", ""))], reported
