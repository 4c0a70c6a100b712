"""A private redis-server on a free loopback port, which a test can stop and start again."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from pipeline.testing.ports import free_port


def start_redis(port: int, *options: str, timeout_s: float = 10.0) -> subprocess.Popen[bytes]:
    """``redis-server`` on loopback ``port`` with ``options``, once it answers ``PING``.

    A server that exits or does not answer within ``timeout_s`` fails the test (and is killed).
    """
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return process
        except OSError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            process.wait(timeout=10)
            raise AssertionError(f"redis-server on port {port} did not start")
        time.sleep(0.05)


@contextlib.contextmanager
def private_redis(*options: str) -> Iterator[str]:
    """The URL of a private ``redis-server`` on a free port started with ``options``.

    Stopped (SIGTERM) at the end.
    """
    port = free_port()
    process = start_redis(port, *options)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=10)


class RedisServer:
    """``redis-server`` with an append-only file, so its data survives a stop and start."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        """Describe a server keeping its files in ``directory``; nothing starts yet."""
        self.directory = directory
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's Redis URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the server and wait until it accepts connections."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = start_redis(
            self.port,
            *("--save", "", "--appendonly", "yes", "--appendfsync", "always"),
            *("--dir", str(self.directory), "--daemonize", "no"),
            timeout_s=timeout_s,
        )

    def stop(self) -> None:
        """Stop the server (SIGTERM: it writes its append-only file and exits)."""
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@contextlib.asynccontextmanager
async def private_client(directory: Path) -> AsyncIterator[Redis]:
    """A client of a redis-server of its own in ``directory``: its command counts are the caller's.

    Skips the test when ``redis-server`` is not installed.
    """
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed; run `make services`")
    server = RedisServer(directory)
    server.start()
    client = Redis.from_url(server.url)
    try:
        yield client
    finally:
        await client.aclose()
        server.stop()


async def command_calls(client: Redis, command: str) -> int:
    """How many ``command`` calls the server has run (those called from Lua included)."""
    stats = await client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


@contextlib.contextmanager
def password_redis(password: str) -> Iterator[int]:
    """The port of a private ``redis-server --requirepass PASSWORD``, stopped at the end.

    Without persistence; ready when its log says it accepts connections (a ``PING`` would only
    be refused). Skips the test when ``redis-server`` is not installed.
    """
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed; run `make services`")
    port = free_port()
    process = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--requirepass", password, "--daemonize", "no"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:  # its log says when it accepts connections
            if "Ready to accept connections" in line:
                break
        else:
            raise AssertionError(f"redis-server on port {port} did not start")
        yield port
    finally:
        process.terminate()
        process.communicate(timeout=10)
