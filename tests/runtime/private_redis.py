"""A private redis-server without persistence of its own, which a test can crash and restart.

Started ``--appendonly no --save ""``: a restart starts it empty, unless it was given a
``directory`` and told to ``SAVE``, when it starts on that snapshot (what was written after it
is gone, as after a crash of a Redis that snapshots).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
        self.process = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--appendonly", "no", "--save", "", *where),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise AssertionError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)

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
