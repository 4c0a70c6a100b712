"""The HTTP layer's head cap on a connection that pipelines requests, driven read by read.

:class:`~pipeline.ingress.http.IngressProtocol` is fed the exact reads a socket could hand it,
so where one request ends and the next begins inside a read is chosen by the test. The app
behind it is real (sources from files, the SQLite log store).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from types import SimpleNamespace

from ingress.helpers import build
from ingress.signing import hub_signature

from pipeline.ingress.app import IngressApp
from pipeline.ingress.http import IngressProtocol, ingress_protocol
from pipeline.logstore.sqlite import SqliteLogStore

SECRET = "pipelining-secret"  # noqa: S105 - a test secret
GITHUB = {
    "scheme": "github",
    "secrets": [SECRET],
    "tenant": {"pointer": "/repository/owner/login"},
    "topic": "events",
}
HEAD_CAP_BYTES = 65_536


class Wire:
    """The transport side of one connection: what the server wrote, and whether it closed."""

    def __init__(self) -> None:
        """Nothing written yet."""
        self.written = b""
        self.closed = asyncio.Event()
        self.changed = asyncio.Event()

    def write(self, data: bytes) -> None:
        """Keep what the server sends."""
        self.written += data
        self.changed.set()

    def close(self) -> None:
        """The server closed the connection."""
        self.closed.set()
        self.changed.set()

    def can_write_eof(self) -> bool:
        """The server may end its side (a refusal's lingering close)."""
        return True

    def write_eof(self) -> None:
        """The server ended its side after a refusal: the connection is over for the client."""
        self.closed.set()
        self.changed.set()

    def is_closing(self) -> bool:
        """Whether :meth:`close` or :meth:`write_eof` was called."""
        return self.closed.is_set()

    def pause_reading(self) -> None:
        """Reading is paused (nothing to do: the test feeds the reads)."""

    def resume_reading(self) -> None:
        """Reading resumes."""

    def statuses(self) -> list[int]:
        """The status codes written so far, in order."""
        return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", self.written)]


def signed_request(owner: str, pad_bytes: int = 0) -> bytes:
    """A whole signed GitHub delivery, its body padded to about ``pad_bytes``."""
    body = json.dumps({"repository": {"owner": {"login": owner}}, "pad": "x" * pad_bytes}).encode()
    head = (
        "POST /hooks/github HTTP/1.1\r\nHost: ingress\r\nContent-Type: application/json\r\n"
        f"X-Hub-Signature-256: {hub_signature(SECRET, body)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _answered(wire: Wire, count: int) -> list[int]:
    """The statuses once ``count`` answers are written or the connection is closed."""
    async with asyncio.timeout(10):
        while len(wire.statuses()) < count and not wire.is_closing():
            wire.changed.clear()
            await wire.changed.wait()
    return wire.statuses()


def connect(tmp_path: Path, store: SqliteLogStore) -> tuple[IngressApp, IngressProtocol, Wire]:
    """A GitHub source's app over ``store``, and one connection to it."""
    sources = build(tmp_path, {"github": GITHUB}, {"events": "events"})
    app = IngressApp(sources, store, None)
    state = SimpleNamespace(connections=set(), tasks=set())
    protocol = ingress_protocol(app, HEAD_CAP_BYTES)(
        SimpleNamespace(timeout_keep_alive=5), state, {}
    )
    wire = Wire()
    protocol.connection_made(wire)  # type: ignore[arg-type]
    return app, protocol, wire


async def test_a_pipelined_head_after_a_large_body_in_one_read_is_not_counted_with_it(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """Read one holds a 100 KB delivery and the start of the next: both are accepted, not a 431."""
    app, protocol, wire = connect(tmp_path, sqlite_store)
    first, second = signed_request("a", pad_bytes=100_000), signed_request("b")
    protocol.data_received(first + second[:20])
    protocol.data_received(second[20:])
    assert await _answered(wire, 2) == [200, 200]
    assert app.counters["github", "accepted"] == 2
    protocol.connection_lost(None)


async def test_a_pipelined_head_over_the_cap_is_still_refused(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """A head past the cap that starts inside a read after another request is a 431."""
    _, protocol, wire = connect(tmp_path, sqlite_store)
    huge = b"GET /healthz HTTP/1.1\r\nHost: ingress\r\nX-Pad: " + b"p" * 40_000
    protocol.data_received(signed_request("a") + huge)
    for _ in range(3):  # the head never ends: 40 KB more a read
        protocol.data_received(b"p" * 40_000)
    assert await _answered(wire, 2) == [200, 431]
    assert wire.is_closing()
    protocol.connection_lost(None)


async def test_a_whole_pipelined_head_over_the_cap_in_one_read_is_refused(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """A head past the cap that starts and ends inside the same read as its predecessor is a 431."""
    _, protocol, wire = connect(tmp_path, sqlite_store)
    huge = b"GET /healthz HTTP/1.1\r\nHost: ingress\r\nX-Pad: " + b"p" * 70_000 + b"\r\n\r\n"
    protocol.data_received(signed_request("a") + huge)
    assert await _answered(wire, 2) == [200, 431]
    protocol.connection_lost(None)
