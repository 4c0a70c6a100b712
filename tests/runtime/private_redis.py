"""A private redis-server without persistence of its own, which a test can crash and restart.

Started ``--appendonly no --save ""``: a restart starts it empty, unless it was given a
``directory`` and told to ``SAVE``, when it starts on that snapshot (what was written after it
is gone, as after a crash of a Redis that snapshots).
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from ingress.redis_server import start_redis
from redis.asyncio import Redis

from pipeline.testing.ports import free_port


class BareRedis:
    """A private redis-server with no save points and no append-only file."""

    def __init__(self, directory: Path | None = None) -> None:
        """Pick a free port; snapshots (``SAVE``) in ``directory`` if given; nothing starts yet."""
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (on its snapshot, if any) and wait until it answers."""
        where = () if self.directory is None else ("--dir", str(self.directory))
        self.process = start_redis(self.port, "--appendonly", "no", "--save", "", *where)

    def stop(self) -> None:
        """Stop it (SIGTERM; with no save points it writes nothing)."""
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def crash(self) -> None:
        """SIGKILL it: what was written since its last snapshot is gone."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
            self.process = None


@contextmanager
def bare_redis(directory: Path | None = None) -> Iterator[BareRedis]:
    """A started :class:`BareRedis`, stopped at the end."""
    server = BareRedis(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@asynccontextmanager
async def bare_client(directory: Path | None = None) -> AsyncIterator[tuple[BareRedis, Redis]]:
    """A started :class:`BareRedis` and a client of it; closed and stopped at the end."""
    with bare_redis(directory) as server:
        client = Redis.from_url(server.url)
        try:
            yield server, client
        finally:
            await client.aclose()
