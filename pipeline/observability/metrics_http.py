"""The HTTP/1.1 layer of a metrics port: bounded connections, each request due in time.

uvicorn's own protocols have no timeout for a request head that never ends and no bound on
connections: anyone who reached a metrics port could hold connections open (sending nothing,
or half a head) until the process ran out of file descriptors, and then the member's own
broker, Redis and database connections failed and the kubelet's probes and Prometheus's
scrapes were refused. :class:`MetricsProtocol` plugs into uvicorn's server
(``uvicorn.Config(http=...)``) and answers from :meth:`MetricsServer.answer
<pipeline.observability.server.MetricsServer.answer>`, never waiting:

* a request must be whole within :data:`REQUEST_WITHIN_S` of the connection's start or of the
  answer before it: a head still unfinished then is **408**, an idle keep-alive connection is
  closed;
* a request (head and body) past :data:`MAX_REQUEST_BYTES` is **431**, bytes that are not
  HTTP/1.1 **400**; either closes the connection;
* at most :data:`MAX_CONNECTIONS` connections are open: one past the bound closes the one that
  has sent nothing for the longest (:class:`~pipeline.observability.connections.OpenConnections`,
  one log line at most every few seconds), so a flood keeps a few dozen descriptors and the
  scrape or probe that comes last is answered;
* an answer the client does not read pauses reading, and the requests it pipelined after it
  wait unanswered (at most :data:`MAX_WAITING`, else the connection is closed): the answers a
  client has not read take its socket's buffers and one transport buffer, not one exposition
  for each request it sent; its connection is closed at its deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import httptools

from pipeline.observability.answers import TEXT_PLAIN, Headers, answer_head
from pipeline.observability.bounded import BoundedProtocol
from pipeline.observability.connections import OpenConnections

if TYPE_CHECKING:
    from pipeline.observability.server import MetricsServer

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
"""Connections one metrics port holds open: it serves a scraper and the kubelet's probes."""

REQUEST_WITHIN_S = 10.0
"""Seconds a connection has to send a whole request, from its start or the answer before."""

MAX_REQUEST_BYTES = 16_384
"""Bytes of one request, head and body; a probe's or a scrape's head is a few hundred."""

MAX_WAITING = 32
"""Requests of one connection that may wait behind answers it has not read; past it, closed."""


_Answer = tuple[int, bytes, Headers, bool, bool]
"""Status, body, headers, whether the body is sent (not for HEAD), whether to keep alive."""


class MetricsProtocol(BoundedProtocol):
    """One client connection. :func:`metrics_protocol` binds the server and the bound."""

    server: MetricsServer
    connections: OpenConnections[MetricsProtocol]
    request_within_s = REQUEST_WITHIN_S

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """As uvicorn constructs its protocols; ``config`` and ``app_state`` are not used."""
        del config, app_state
        super().__init__(server_state, _loop)
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._deadline: asyncio.TimerHandle | None = None
        self._bytes = 0  # bytes received since the last answer
        self._size = 0  # bytes of the request being parsed
        self._url = b""
        self._paused = False  # the transport's buffer is full: answers wait in ``_waiting``
        self._waiting: deque[_Answer] = deque()  # answers to requests pipelined, not written

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Admit the connection under the bound; its first request is due in time."""
        if self._admit(transport):
            self._due()

    def connection_lost(self, exc: Exception | None) -> None:
        """It no longer counts; the parser and the transport are let go."""
        del exc
        self._let_go()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._parser = None
        self._transport = None
        self._waiting.clear()

    def data_received(self, data: bytes) -> None:
        """Parse ``data``; each request it completes is answered at once, in order."""
        parser = self._parser
        if self._stopped or parser is None:
            return
        self.connections.active(self)
        self._bytes += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._close()
        except httptools.HttpParserError:
            self._refuse(HTTPStatus.BAD_REQUEST)
        if not self._stopped and self._bytes > MAX_REQUEST_BYTES:  # counted as it comes
            self._too_large()

    def pause_writing(self) -> None:
        """The client reads nothing: read no more of its requests, answer none until it reads."""
        self._paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        """The client read its answers: write those waiting, then read again."""
        self._paused = False
        while self._waiting and not self._paused and not self._stopped:
            self._answer(self._waiting.popleft())
        if self._transport is not None and not self._stopped and not self._paused:
            self._transport.resume_reading()

    def evict(self) -> None:
        """Close this connection for a new one; answers it has not read are dropped."""
        self._close()

    def shutdown(self) -> None:
        """The server shuts down: close now (every answer is written when its request ends)."""
        self._close()

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        """A request starts."""
        self._url = b""
        self._size = 0

    def on_url(self, url: bytes) -> None:
        """Part of the request target."""
        self._url += url
        self._size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """A header: only its size counts."""
        self._size += len(name) + len(value) + 4

    def on_body(self, body: bytes) -> None:
        """Body bytes: only their size counts."""
        self._size += len(body)

    def on_message_complete(self) -> None:
        """The request is whole: answer it, then wait for the next one (or close)."""
        parser, transport = self._parser, self._transport
        if self._stopped or parser is None or transport is None:
            return
        if self._size > MAX_REQUEST_BYTES:  # whole within one read, but too large all the same
            self._too_large()
            return
        path = httptools.parse_url(self._url).path.decode("latin-1")
        method = parser.get_method().decode("latin-1")
        status, body, headers = self.server.answer(method, path)  # the body is not copied
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        answer = (status, body, headers, method != "HEAD", keep_alive)
        if not self._paused and not self._waiting:
            self._answer(answer)
        elif len(self._waiting) < MAX_WAITING:
            self._waiting.append(answer)
        else:
            log.info(
                "metrics port: a client pipelined more than %d requests without reading their"
                " answers; its connection is closed",
                MAX_WAITING,
            )
            self._close()

    def _answer(self, answer: _Answer) -> None:
        """Write ``answer``; the next request is then due in time (or the connection ends)."""
        status, body, headers, with_body, keep_alive = answer
        self._write(status, headers, body if with_body else b"", len(body), keep_alive=keep_alive)
        if keep_alive:
            self._bytes = 0
            self._due()

    # -- answers ---------------------------------------------------------------------------

    def _due(self) -> None:
        """The next request is due within ``request_within_s`` from now."""
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._loop.call_later(self.request_within_s, self._late)

    def _late(self) -> None:
        self._deadline = None
        if self._stopped or self._paused or self._waiting:  # answers the client has not read
            self._close()
        elif self._bytes:  # a request begun and not finished
            log.info("metrics port: request not received in time refused (408)")
            self._refuse(HTTPStatus.REQUEST_TIMEOUT)
        else:
            self._close()

    def _too_large(self) -> None:
        log.info("metrics port: request over %d bytes refused (431)", MAX_REQUEST_BYTES)
        self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)

    def _refuse(self, status: HTTPStatus) -> None:
        if self._waiting:  # its answer would come before theirs: end the connection instead
            self._close()
            return
        body = f"{status.phrase.lower()}\n".encode()
        self._write(status, [TEXT_PLAIN], body, len(body), keep_alive=False)

    def _write(
        self, status: int, headers: Headers, body: bytes, length: int, *, keep_alive: bool
    ) -> None:
        transport = self._transport
        if transport is None or self._stopped:
            return
        transport.write(
            b"".join([*answer_head(status, headers, length, keep_alive=keep_alive), body])
        )
        if not keep_alive:
            self._stopped = True
            transport.close()

    def _close(self) -> None:
        """Close now; output the client has not read is dropped (it would hold the descriptor)."""
        self._stopped = True
        self._drop()


def metrics_protocol(
    server: MetricsServer, max_connections: int = MAX_CONNECTIONS
) -> type[MetricsProtocol]:
    """The protocol class for uvicorn's ``http`` setting: ``server``'s, at most ``max_connections``.

    One bound for each port served.
    """
    connections = OpenConnections[MetricsProtocol](
        max_connections,
        bound="the bound of the metrics port",
        log=log,
    )
    attributes = {"server": server, "connections": connections}
    return type("MetricsHttp", (MetricsProtocol,), attributes)
