"""Connections whose client reads no answer hold their descriptor past the connection bound.

A client pipelines hundreds of ``GET /metrics`` and reads none of the answers: they fill the
socket and the transport's buffer (megabytes: past what the kernel's send buffer takes), and a
transport closed with output still buffered keeps its descriptor until the client reads it,
which it never does. Such a connection, once answered, is "stalled" for
``PIPELINE_INGRESS__MAX_CONNECTIONS``, and a new connection evicted it: it left the bookkeeping
while its descriptor stayed open, so each one evicted was a descriptor past the bound (bound 20:
60 such connections held 60 descriptors, 240 held 98, and more without end), the very exhaustion
the bound is there to stop. An evicted connection with output still buffered is aborted, so the
process holds no more client descriptors than the bound.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
from pathlib import Path

from ingress.helpers import start_empty_ingress
from runtime.helpers import eventually

BOUND = 8
UNREAD = 3 * BOUND  # each one admitted past the first BOUND evicts an earlier one
UNREAD_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: ingress\r\n\r\n"
PIPELINED = 500  # answers of about 7 MB: more than the kernel's send buffer takes (4 MiB)
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: ingress\r\n\r\n"


def _descriptors(pid: int) -> int:
    return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())


def _admitted(sock: socket.socket) -> bool:
    """Whether the server answers ``sock`` (a connection past the bound is closed at once)."""
    sock.settimeout(20)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except ConnectionError:
        return False


def _unread(port: int) -> socket.socket | None:
    """A connection that pipelines many requests and reads none of the answers (None: refused)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)  # noqa: FBT003 - the socket API
    with contextlib.suppress(BlockingIOError, ConnectionError):
        sock.send(UNREAD_REQUEST * PIPELINED)
    if _admitted(sock):
        return sock
    sock.close()
    return None


def _answered(port: int) -> bool:
    """A fresh connection's ``GET /healthz`` is answered (it evicts the oldest stalled one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        try:
            sock.sendall(REQUEST)
            return sock.recv(64).startswith(b"HTTP/1.1 200")
        except ConnectionError:
            return False


async def test_evicted_connections_that_read_nothing_give_their_descriptor_back(
    tmp_path: Path, redis_service: str
) -> None:
    """However many unread connections are evicted, client descriptors stay within the bound."""
    proc = start_empty_ingress(
        tmp_path, redis_service, PIPELINE_INGRESS__MAX_CONNECTIONS=str(BOUND)
    )
    held: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ingress listening on "), line
        port = int(line.rsplit(":", 1)[1])
        at_rest = _descriptors(proc.pid)
        while len(held) < UNREAD:  # a refused one (every one still answering) is tried again
            sock = _unread(port)
            if sock is not None:
                held.append(sock)
        # Fresh connections evict what is left of the unread ones: none may keep its descriptor.
        await eventually(
            lambda: _answered(port) and _descriptors(proc.pid) <= at_rest + BOUND, timeout_s=30
        )
        assert proc.poll() is None
    finally:
        for sock in held:
            sock.close()
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=60)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
