"""A slow upload that keeps sending outlives connections that stall, at the connection bound.

Past ``PIPELINE_INGRESS__MAX_CONNECTIONS`` a new connection evicts a stalled one. Evicting the
oldest by the time it connected let an attacker evict any upload that took longer than the
bound's worth of its new connections: bound 8, one connection opened (and left idle) after each
chunk a legitimate client sent of its body, and the upload was answered 503 at the first one
past the bound, though it had sent a chunk just before. The connection evicted is the one that
has sent nothing for the longest, so the upload is answered and the idle connections evicted.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
from pathlib import Path

from ingress.helpers import start_empty_ingress

BOUND = 8
CHUNKS = 3 * BOUND
HEAD = b"POST /hooks/nowhere HTTP/1.1\r\nHost: ingress\r\nContent-Length: %d\r\n\r\n" % CHUNKS


def _served_so_far(metrics_port: int) -> None:
    """A round trip through the metrics port: the server has read what was sent before it.

    The metrics port is served by the same event loop, outside the connection bound.
    """
    with socket.create_connection(("127.0.0.1", metrics_port), timeout=20) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: ingress\r\nConnection: close\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.1 200"), "the metrics port did not answer"


def _idle(port: int) -> socket.socket:
    """A connection answered once and then idle: admitted (and one evicted past the bound)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(b"GET /nothing HTTP/1.1\r\nHost: ingress\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 404")
    return sock


def _send(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # evicted: the answer says so
        sock.sendall(data)


def _status(sock: socket.socket) -> int:
    answer = b""
    while b"\r\n" not in answer:
        part = sock.recv(4096)
        if not part:
            return 0  # closed without an answer
        answer += part
    return int(answer.split(b" ", 2)[1])


def test_an_upload_sending_chunk_by_chunk_is_not_evicted_for_stalled_connections(
    tmp_path: Path, redis_service: str
) -> None:
    """Stalled connections opened between its chunks are evicted before the upload."""
    metrics_port = _free_port()
    proc = start_empty_ingress(
        tmp_path,
        redis_service,
        PIPELINE_INGRESS__MAX_CONNECTIONS=str(BOUND),
        PIPELINE_INGRESS__METRICS_PORT=str(metrics_port),
        PIPELINE_INGRESS__BODY_TIMEOUT_S="120",  # heads and bodies wait; no timer in the test
    )
    held: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ingress listening on "), line
        port = int(line.rsplit(":", 1)[1])
        upload = socket.create_connection(("127.0.0.1", port), timeout=20)
        held.append(upload)
        _send(upload, HEAD)
        held += [_idle(port) for _ in range(BOUND - 1)]  # the bound is reached
        for _ in range(CHUNKS - 1):
            _send(upload, b"a")
            _served_so_far(metrics_port)  # the chunk is read
            held.append(_idle(port))  # one past the bound: a stalled connection is evicted
        _send(upload, b"a")
        assert _status(upload) == 404  # answered as a whole request (no such source), not 503
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
