"""Every way a connection ends gives its place under the connection bound back, exactly once.

Connections end by an answer with ``Connection: close``, a 400, a 431, the client's reset
mid-head, the client's close after keep-alive answers, or eviction for a new one. After many
of each, ``PIPELINE_INGRESS__MAX_CONNECTIONS`` connections are held without one evicted, and the
next one evicts exactly the one stalled for the longest: the count neither kept a lost
connection (fewer held) nor let one go twice (more held).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import struct
import subprocess
from pathlib import Path

from ingress.helpers import start_empty_ingress

BOUND = 8
ROUNDS = 20
STALLED = b"POST /hooks/nowhere HTTP/1.1\r\nHost: ingress\r\n"  # half a head, never finished
ENDINGS = (
    b"GET /healthz HTTP/1.1\r\nHost: ingress\r\nConnection: close\r\n\r\n",
    b"NOT HTTP AT ALL\r\n\r\n",  # 400
    b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n",  # 431
)


def _answered_then_closed(port: int, request: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(request)
        while sock.recv(65536):  # the server closes it after its answer
            pass


def _keep_alive_then_client_close(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        for _ in range(2):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: ingress\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")


def _reset_mid_head(port: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(STALLED)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # RST


def _stall(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(STALLED)
    return sock


def _admitted_now(port: int) -> socket.socket:
    """A connection whose request is answered: every connection opened before it is admitted.

    The server accepts connections in the order they connected, and an eviction's 503 is
    written when the connection past the bound is admitted, before this one's answer.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(b"GET /nothing HTTP/1.1\r\nHost: ingress\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 404")
    return sock


def _evicted(sock: socket.socket) -> bool:
    """Whether the server answered ``sock`` (a 503 when evicted) or closed it."""
    sock.setblocking(False)  # noqa: FBT003 - the socket API
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
    return True


def test_every_ending_gives_the_place_back_once(tmp_path: Path, redis_service: str) -> None:
    """After 280 connections ended every way, the bound holds BOUND and evicts the oldest."""
    proc = start_empty_ingress(
        tmp_path,
        redis_service,
        PIPELINE_INGRESS__MAX_CONNECTIONS=str(BOUND),
        PIPELINE_INGRESS__MAX_HEAD_BYTES="4096",
        PIPELINE_INGRESS__BODY_TIMEOUT_S="120",  # heads wait; no timer in the test
    )
    held: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ingress listening on "), line
        port = int(line.rsplit(":", 1)[1])
        for _ in range(ROUNDS):
            for request in ENDINGS:
                _answered_then_closed(port, request)
            _keep_alive_then_client_close(port)
            _reset_mid_head(port)
            stalled = [_stall(port) for _ in range(BOUND)]
            stalled.append(_admitted_now(port))  # one past the bound: the oldest is evicted
            assert [_evicted(sock) for sock in stalled] == [True] + [False] * BOUND
            for sock in stalled:
                sock.close()
        _keep_alive_then_client_close(port)  # round trips: the closes above are read
        held += [_stall(port) for _ in range(BOUND - 1)]
        held.append(_admitted_now(port))
        assert not any(_evicted(sock) for sock in held)  # a lost connection still counted
        held.append(_admitted_now(port))
        assert [_evicted(sock) for sock in held] == [True] + [False] * BOUND  # one let go twice
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
