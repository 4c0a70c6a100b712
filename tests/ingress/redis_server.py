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
from support import IN_CI

from pipeline.testing.ports import free_port


def start_redis(port: int, *options: str, timeout_s: float = 10.0) -> subprocess.Popen[bytes]:
    """``redis-server`` on loopback ``port`` with ``options``, once it answers as itself.

    Ready when the server on ``port`` says its ``process_id`` is this process's: another test's
    server that won the port would answer ``PING`` too. A server that exits or does not answer
    within ``timeout_s`` fails the test; whatever ends the wait (a failure, an interrupt), the
    process is killed unless returned.
    """
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        started = _answered_as(process, port, time.monotonic() + timeout_s)
    except BaseException:
        process.kill()
        process.wait(timeout=10)
        raise
    if not started:
        process.kill()
        process.wait(timeout=10)
        raise AssertionError(f"redis-server on port {port} did not start")
    return process


def _answered_as(process: subprocess.Popen[bytes], port: int, deadline: float) -> bool:
    """Whether the server on ``port`` said it is ``process`` before ``deadline`` (or it ended)."""
    mine = f"process_id:{process.pid}\r\n".encode()
    while process.poll() is None and time.monotonic() < deadline:
        if mine in _server_info(port):
            return process.poll() is None
        time.sleep(0.05)
    return False


def _server_info(port: int) -> bytes:
    """``INFO server`` of whatever listens on loopback ``port`` (b"" if nothing answers)."""
    reply = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"INFO server\r\n")
            while not reply.endswith(b"\r\n\r\n") or reply.count(b"\r\n") < 3:
                part = sock.recv(65536)
                if not part:
                    break
                reply += part
    except OSError:
        pass
    return reply


def require_redis_server() -> None:
    """Skip (locally) or fail (under CI=true) when ``redis-server`` is not installed."""
    if shutil.which("redis-server") is None:
        message = "redis-server is not installed; run `make services`"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


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
    require_redis_server()
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
    require_redis_server()
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
