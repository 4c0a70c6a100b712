"""The HTTP layer of the ingress: uvicorn's httptools protocol with a cap on the request head.

httptools has no limit of its own: it buffers a header line whole before handing it over, so one
200 MiB header grows the process by hundreds of MB before the application sees anything.
:func:`bounded_protocol` counts the bytes a request head has taken so far and, past the cap,
answers **431 Request Header Fields Too Large** and closes the connection; at most one read
chunk beyond the cap is ever buffered.
"""

from __future__ import annotations

import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

_RESPONSE_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/json\r\n"
    b"content-length: 35\r\n"
    b"connection: close\r\n"
    b"\r\n"
    b'{"error": "request head too large"}'
)


class _BoundedHttpToolsProtocol(HttpToolsProtocol):
    """Refuses a request whose head (request line and headers) passes ``max_head_bytes``."""

    max_head_bytes = 65_536

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As uvicorn's protocol; no request head is being read yet."""
        super().__init__(*args, **kwargs)
        self._head_bytes: int | None = None  # None: not inside a request head
        self._chunk_bytes = 0  # the chunk being parsed
        self._refused = False

    def on_message_begin(self) -> None:
        """A request starts: count its head from here."""
        super().on_message_begin()
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        """The head is in: stop counting, and refuse it if it came in one chunk over the cap.

        The head is no longer than what was read before this chunk plus this chunk, so its
        exact size is only added up when that bound passes the cap.
        """
        bound = (self._head_bytes or 0) + self._chunk_bytes
        self._head_bytes = None
        if bound > self.max_head_bytes:
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > self.max_head_bytes:
                self._refuse()
                return
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        """Parse ``data``; answer 431 once the current head has passed the cap."""
        if self._refused:
            return
        self._chunk_bytes = len(data)
        super().data_received(data)
        if self._head_bytes is None or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > self.max_head_bytes:
            self._refuse()

    def on_body(self, body: bytes) -> None:
        """Body bytes of a request not refused."""
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        """The end of a request not refused."""
        if not self._refused:
            super().on_message_complete()

    def _refuse(self) -> None:
        log.info("request head over %d bytes refused (431)", self.max_head_bytes)
        self._refused = True
        self._head_bytes = None
        self.transport.write(_RESPONSE_431)
        self.transport.close()


def bounded_protocol(max_head_bytes: int) -> type[HttpToolsProtocol]:
    """The httptools protocol of uvicorn, answering 431 to heads over ``max_head_bytes``."""
    return type(
        "BoundedHttpToolsProtocol", (_BoundedHttpToolsProtocol,), {"max_head_bytes": max_head_bytes}
    )
