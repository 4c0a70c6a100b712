"""One HTTP/1.1 connection, kept open, to a collector at a plain ``http://`` endpoint.

The exporting process sends one request every ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` spans to the
same URL. Through the SDK's urllib3 transport (its pool manager, connection pool, retry and
timeout objects around ``http.client``) a request of 512 spans costs about 0.2 ms of CPU time
here; straight through ``http.client`` on a kept connection, about 0.1 ms. This transport is the
second: it implements the SDK's transport interface, so the SDK's client keeps the endpoint,
headers, compression, timeout, retries and ``Retry-After``; it only makes the request. A
connection that fails is closed and made again on the next request (the client retries a
connection error once at once, as it does for a pooled connection the server closed). TLS
endpoints keep the SDK's urllib3 transport (:func:`pipeline.tracing.export.lean_transport`).
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from opentelemetry.exporter.http.transport._base import BaseHTTPResult, BaseHTTPTransport

__all__ = ["ConnectFailedError", "PlainHTTPTransport"]


class ConnectFailedError(ConnectionError):
    """The connection to the collector could not be made (refused, unresolved, timed out)."""


class _Headers(Mapping[str, str]):
    """A response's headers, looked up without regard to case (repeated ones joined by ``,``)."""

    def __init__(self, message: http.client.HTTPMessage) -> None:
        self._values: dict[str, str] = {}
        for name, value in message.items():
            key = name.lower()
            self._values[key] = f"{self._values[key]}, {value}" if key in self._values else value

    def __getitem__(self, name: str) -> str:
        return self._values[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


@dataclass(frozen=True, slots=True)
class PlainHTTPResult(BaseHTTPResult):
    """A response read whole (``status_code``, ``reason``, body, headers), or an ``error``."""

    body: bytes = b""
    response_headers: Mapping[str, str] = field(default_factory=dict)

    def content(self) -> bytes:
        """The response's body."""
        return self.body

    def headers(self) -> Mapping[str, str]:
        """The response's headers, case-insensitive."""
        return self.response_headers


@dataclass(frozen=True, slots=True)
class _Target:
    host: str
    port: int
    path: str


class PlainHTTPTransport(BaseHTTPTransport):
    """Requests to ``http://`` URLs over one kept connection per host and port."""

    def __init__(self) -> None:
        """No connection yet: the first request makes it."""
        self._targets: dict[str, _Target] = {}
        self._connections: dict[tuple[str, int], http.client.HTTPConnection] = {}

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        data: bytes | None = None,
    ) -> BaseHTTPResult:
        """Send the request and read its response; a failure is the result's ``error``."""
        target = self._targets.get(url) or self._target(url)
        address = (target.host, target.port)
        connection = self._connections.get(address)
        try:
            if connection is None:
                connection = self._connect(target, timeout)
            elif connection.sock is not None:
                connection.sock.settimeout(timeout)
            connection.request(method, target.path, body=data, headers=headers or {})
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as error:
            self._drop(address)
            return PlainHTTPResult(error=error)
        if response.will_close:
            self._drop(address)
        return PlainHTTPResult(
            status_code=response.status,
            reason=response.reason,
            body=body,
            response_headers=_Headers(response.msg),
        )

    def close(self) -> None:
        """Close every kept connection."""
        for address in list(self._connections):
            self._drop(address)

    def is_connection_error(self, exception: Exception | None) -> bool:
        """Whether the request failed for its connection (made, or lost before a response).

        As the SDK's transports count them: a refused, unresolved or timed-out connect, a
        connection reset or closed by the server, a malformed response; not a response that did
        not come in time on a connection that worked.
        """
        return isinstance(exception, (ConnectionError, http.client.HTTPException))

    def _target(self, url: str) -> _Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            msg = f"{url!r}: PlainHTTPTransport sends to http:// URLs only"
            raise ValueError(msg)
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        target = self._targets[url] = _Target(parts.hostname, parts.port or 80, path)
        return target

    def _connect(self, target: _Target, timeout: float | None) -> http.client.HTTPConnection:
        connection = http.client.HTTPConnection(target.host, target.port, timeout=timeout)
        try:
            connection.connect()
        except OSError as error:  # refused, unresolved (socket.gaierror), timed out
            connection.close()
            raise ConnectFailedError(f"{target.host}:{target.port}: {error}") from error
        self._connections[(target.host, target.port)] = connection
        return connection

    def _drop(self, address: tuple[str, int]) -> None:
        connection = self._connections.pop(address, None)
        if connection is not None:
            connection.close()
