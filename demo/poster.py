"""A small keep-alive HTTP/1.1 client for the traffic generator.

The generator posts a few hundred small webhooks a second from one process that shares two
cores with everything it loads. A general-purpose client spends more CPU per request than the
ingress does; this one keeps a fixed pool of persistent connections and does only what the
ingress's answers need (status line, headers, ``Content-Length`` body).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from pipeline.errors import PipelineError


class HttpError(PipelineError):
    """The connection failed or the answer was not HTTP/1.1."""


@dataclass(frozen=True, slots=True)
class Response:
    """An answer: status, lower-case headers, body."""

    status: int
    headers: dict[str, str]
    body: bytes


_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Poster:
    """Posts over at most ``connections`` persistent connections to one ``http://`` origin."""

    def __init__(self, url: str, connections: int = 32, timeout_s: float = 30.0) -> None:
        """Connect lazily to ``url`` (``http://host:port``)."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise HttpError(f"expected http://host:port, got {url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._authority = parts.netloc
        self._timeout_s = timeout_s
        self._idle: asyncio.LifoQueue[_Connection | None] = asyncio.LifoQueue()
        for _ in range(connections):
            self._idle.put_nowait(None)  # a slot that has no connection yet
        self._open: set[asyncio.StreamWriter] = set()

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> Response:
        """POST ``body`` to ``path``; raise :class:`HttpError` on a connection failure."""
        slot = await self._idle.get()
        try:
            if slot is None:
                slot = await self._connect()
            response = await asyncio.wait_for(
                self._exchange(slot, path, body, headers), self._timeout_s
            )
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            if slot is not None:
                self._discard(slot)
            self._idle.put_nowait(None)
            raise HttpError(f"POST {path}: {exc!r}") from exc
        if response.headers.get("connection", "").lower() == "close":
            self._discard(slot)
            self._idle.put_nowait(None)
        else:
            self._idle.put_nowait(slot)
        return response

    async def close(self) -> None:
        """Close every open connection."""
        for writer in list(self._open):
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        self._open.clear()

    async def _connect(self) -> _Connection:
        reader, writer = await asyncio.open_connection(self._host, self._port)
        self._open.add(writer)
        return reader, writer

    def _discard(self, connection: _Connection) -> None:
        writer = connection[1]
        self._open.discard(writer)
        writer.close()

    async def _exchange(
        self, connection: _Connection, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Response:
        reader, writer = connection
        lines = [
            f"POST {path} HTTP/1.1",
            f"host: {self._authority}",
            f"content-length: {len(body)}",
        ]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        version, status, *_ = status_line.split(" ", 2)
        if not version.startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x answer: {status_line!r}")
        answer = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                answer[name.strip().lower()] = value.strip()
        length = int(answer.get("content-length", "0"))
        payload = await reader.readexactly(length) if length else b""
        return Response(int(status), answer, payload)
