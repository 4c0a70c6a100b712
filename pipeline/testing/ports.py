"""A loopback port for a server a test or benchmark starts later, in another process.

Asking the kernel for port 0 returns a port from its ephemeral range, the same range it hands
to outgoing connections. Between the moment the port is picked and the moment the server binds
it, any process that connects anywhere (a consumer dialling Redis or Kafka, say) may be given
that port as its local end, and the server then fails with "address already in use". A port
picked *below* the ephemeral range is never handed out that way, so only another caller picking
the same port could take it: :func:`free_port` checks that it binds now and never returns the
same port twice in one process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000
"""Ports below this are left to services with well-known numbers."""
DEFAULT_EPHEMERAL_START = 32_768
"""Linux's default first ephemeral port, used where the kernel's setting can't be read."""
ATTEMPTS = 200

_given: set[int] = set()
_lock = threading.Lock()
_random = random.SystemRandom()


def ephemeral_start(path: Path = PORT_RANGE_FILE) -> int:
    """The first port of the kernel's ephemeral range (``ip_local_port_range``)."""
    try:
        return int(path.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def free_port(host: str = "127.0.0.1", *, below: int | None = None) -> int:
    """A port on ``host`` that binds now and lies below the ephemeral range (``below``)."""
    top = ephemeral_start() if below is None else below
    if top <= LOWEST:
        raise OSError(
            f"free_port: the ephemeral range starts at {top}, leaving no port in "
            f"{LOWEST}..{top}; raise net.ipv4.ip_local_port_range's first number"
        )
    with _lock:
        for _ in range(ATTEMPTS):
            port = _random.randrange(LOWEST, top)
            if port in _given or not _binds(host, port):
                continue
            _given.add(port)
            return port
    raise OSError(f"free_port: no port in {LOWEST}..{top} on {host} bound in {ATTEMPTS} tries")


def _binds(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
