"""The HTTP/1.1 layer of the ingress: httptools parsing, webhooks handed straight to the app.

A webhook (``POST /hooks/{source}``) is parsed by httptools and, once its body is whole, handed to
:meth:`IngressApp.webhook <pipeline.ingress.app.IngressApp.webhook>` with its headers: no ASGI
scope, no receive and send messages, one task per request and one write per answer. Any other
request (Meta's ``GET`` handshake, ``/metrics``, an unknown path) goes to the app's ASGI entry
point with its body already read. :class:`IngressProtocol` plugs into uvicorn's server
(``uvicorn.Config(http=...)``), which keeps binding, lifespan, signals and graceful shutdown.

At the door, before the app sees a byte:

* a request head (request line and headers) past ``max_head_bytes`` is answered **431**, its
  JSON body naming the cap and ``PIPELINE_INGRESS__MAX_HEAD_BYTES`` (a 64 KiB path too: uvicorn's
  own protocols, whose answer to one is a plain-text 400, are not used), and the connection
  closed; httptools has no limit of its own (it buffers a header line whole), so the bytes of a
  head are counted as they come, and at most one read chunk past the cap is buffered (two for
  a head that starts inside a read after a pipelined request: the bytes of that read before it
  belong to the request before, so only the reads after it are counted, and the head's exact
  size is checked once it is whole);
* a body over its source's ``max_body_bytes`` (the declared Content-Length first, then the bytes
  as they come) is **413**, counted ``too_large``, its JSON body naming the cap and the setting
  that raises it; the body of any other request is read and dropped (nothing else reads one);
* a request not whole within the app's ``body_timeout_s`` of the read that left it incomplete
  is **408** (a body counted ``body_timeout``; a head that never ends too), and a connection
  that sends nothing is closed after ``timeout_keep_alive``;
* the heads and bodies left unfinished by a read are counted across every connection of the
  server: a read that takes them past :data:`MAX_UNFINISHED_BODY_BYTES` is **503**
  (Retry-After 1; a body's counted ``body_budget``), and its bytes let go, so connections
  that each hold most of a large head or body cannot take memory without bound; a request
  whole within its read is never counted;
* the connections of the server are bounded
  (:class:`~pipeline.observability.connections.OpenConnections`): a connection past
  ``max_connections`` closes, of those with no request being answered, the one that has
  sent nothing for the longest (its unfinished head or body is **503**; answers it has not
  read are dropped), or, when every one is answering, is closed at once; each is
  counted ``connection_limit`` and a line logged at most once per
  :data:`~pipeline.observability.connections.LIMIT_LOG_EVERY_S`,
  so stalled connections cannot take the descriptors legitimate webhooks, the log store and
  the broker need;
* a client gone mid-body is counted ``disconnected``; nothing is stored;
* a request target (path and query) over :data:`MAX_TARGET_BYTES` that the head cap let
  through (the cap raised past 64 KiB) is **414**; bytes that are not HTTP/1.1, or a target
  that is not a URL, are **400**.

Each refusal logs one INFO line, alike ones backed off
(:class:`~pipeline.ingress.refusals.Refusals`): a source's 413 and 408 as the app's own refusals
(``webhook refused from source S: REASON``), the others naming the cap or what was wrong; an
unknown source's or path's 404, a refused handshake's 403 and a method's 405 are the app's lines
(:mod:`pipeline.ingress.app`), judged by fixed keys, never by the path.
A ``HEAD`` is answered as its ``GET`` (the status and headers, Content-Length included), without
the body.

Each of these answers closes the connection, lingering: the ingress ends its side after the
answer, then reads and drops what the client still sends (the rest of a refused body) until the
client closes, or for at most :data:`LINGER_BYTES`, :data:`LINGER_S` in all and
:data:`LINGER_IDLE_S` of silence, counted under the connection bound all the while. Closed at
once, a client still sending would be reset before it read the answer (Python's urllib, which
sends the whole body first, got ``Broken pipe`` instead of a 413).

Requests pipelined on one connection are answered in order, one at a time; reading pauses while
:data:`PIPELINE_DEPTH` wait, or while the socket cannot take more output. An idle keep-alive
connection closes after uvicorn's ``timeout_keep_alive``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import httptools

from pipeline.ingress.app import AsgiMessage, declared_over, too_large
from pipeline.ingress.headers import JOINED_REQUEST_HEADERS
from pipeline.observability.answers import Headers, answer_head
from pipeline.observability.bounded import BoundedProtocol
from pipeline.observability.connections import OpenConnections

if TYPE_CHECKING:
    from pipeline.ingress.app import IngressApp
    from pipeline.ingress.source import Source

log = logging.getLogger(__name__)

PIPELINE_DEPTH = 8
"""Parsed requests that may wait on one connection before reading pauses."""

MAX_UNFINISHED_BODY_BYTES = 256 * 1024 * 1024
"""Bytes of request heads and bodies left unfinished by a read that one server holds, over all
its connections.

Nothing is known of a sender before its request is whole (no signature, no tenant), and a
request may take ``body_timeout_s`` to come: without this bound, connections that each send
most of a ``max_body_bytes`` body (or of a ``max_head_bytes`` head) and stall hold that much
each, as many as are opened.
"""

MAX_TARGET_BYTES = 65_535
"""The longest request target (path and query) the ingress can read, whatever the head cap.

httptools' URL parser refuses longer ones (its offsets are 16-bit; not a setting), so a target
past it is answered **414** even where ``PIPELINE_INGRESS__MAX_HEAD_BYTES`` was raised above it.
"""

LINGER_BYTES = 16 * 1024 * 1024
"""The most a refused connection is read after its answer; its bytes are dropped as they come.

A client that writes its whole request before it reads its answer (Python's urllib) is still
sending a body when the door refuses it. Closed with its bytes arriving, the connection is reset
by the kernel and the client sees a broken pipe, not the refusal: so after a refusal the
ingress ends its side and reads on (a lingering close, as nginx's ``lingering_close``), until
the client closes, or this many bytes, :data:`LINGER_S` in all or :data:`LINGER_IDLE_S` of
silence, whichever comes first.
"""

LINGER_S = 5.0
"""The longest a refused connection is read after its answer (:data:`LINGER_BYTES`)."""

LINGER_IDLE_S = 2.0
"""A refused connection that sends nothing for this long after its answer is closed."""

_JSON = (b"content-type", b"application/json")
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_RETRY_1 = (b"retry-after", b"1")


@dataclass(slots=True)
class _Request:
    """One parsed request, or an answer the door gives in its place (``refusal``)."""

    method: bytes
    path: str
    query: bytes
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    source: Source | None
    refusal: tuple[int, bytes] | None = None
    raw_path: bytes = b""


def _refusal(status: int, error: str) -> _Request:
    return _refused(status, b'{"error": "%s"}' % error.encode())


def _refused(status: int, body: bytes) -> _Request:
    """The door's answer ``status`` with the JSON ``body``, in place of a request."""
    return _Request(b"", "", b"", {}, b"", keep_alive=False, source=None, refusal=(status, body))


class UnfinishedBodies:
    """The bytes of unfinished bodies the connections of one server hold, and their bound."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        """Nothing held yet; at most ``limit`` bytes."""
        self.limit = limit
        self.held = 0


class IngressProtocol(BoundedProtocol):
    """One client connection. :func:`ingress_protocol` binds the app and the head cap."""

    app: IngressApp
    max_head_bytes = 65_536
    unfinished = UnfinishedBodies(MAX_UNFINISHED_BODY_BYTES)
    connections: OpenConnections[IngressProtocol] = OpenConnections(None)
    _linger_left: int | None = None  # refused and lingering: bytes it may still send
    _linger_end: asyncio.TimerHandle | None = None
    _linger_read = 0.0  # the loop's time of the last read while lingering

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """As uvicorn constructs its protocols; ``app_state`` is not used."""
        del app_state
        super().__init__(server_state, _loop)  # once _stopped: answer what waits, then close
        self._keep_alive_s: float = config.timeout_keep_alive
        self._tasks: set[asyncio.Task[None]] = server_state.tasks
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._waiting: deque[_Request] = deque()
        self._busy = False  # a request is being answered
        self._closing = False  # server shutdown: close once nothing is in flight
        self._write_paused = False
        self._read_paused = False
        self._idle: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        # The request being parsed.
        self._url = b""
        self._headers: dict[str, str] = {}
        self._head_bytes: int | None = None  # None: not inside a request head
        self._head_counted = True  # the head began with a read: all its bytes are counted
        self._between = True  # no request is partly read: the next read starts a request
        self._chunk_bytes = 0
        self._in_body = False
        self._method = b""
        self._path = ""
        self._raw_path = b""
        self._query = b""
        self._source: Source | None = None
        self._limit: int | None = None  # None: the body is dropped
        self._size = 0
        self._body: list[bytes] = []
        self._held = 0  # bytes of the unfinished head or body counted in ``unfinished``
        self._keep_alive = True

    # -- the connection --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Count the connection for uvicorn's shutdown."""
        if not self._admit(transport):
            return
        # A client that connects and sends nothing is closed like an idle keep-alive one.
        self._idle = self._loop.call_later(self._keep_alive_s, self._idle_out)

    def connection_lost(self, exc: Exception | None) -> None:
        """A client gone mid-body is counted; a request in flight still finishes (unanswered).

        The parser (its callbacks are this protocol's methods) and the transport (uvloop's
        keeps its protocol) are let go here, so that nothing of the connection waits for the
        cyclic collector's full pass: with the start-up objects frozen (``pipeline/heap.py``)
        that pass is rare, and closed connections would pile up in memory until it came.
        """
        del exc
        self._let_go()
        self._cancel_timers()
        self._hold(0)
        if self._in_body and self._source is not None:
            self.app.counters[self._source.name, "disconnected"] += 1
        self._in_body = False
        self._waiting.clear()
        self._parser = None
        self._transport = None

    def data_received(self, data: bytes) -> None:
        """Parse ``data``; requests it completes are answered in order."""
        parser = self._parser
        if self._stopped or parser is None:
            if self._linger_left is not None:
                self._dropped(len(data))
            return
        self._active()
        self._chunk_bytes = len(data)
        self._between = self._head_bytes is None and not self._in_body
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # A request asking to switch protocols: answered as HTTP/1.1 if it was whole, and
            # the connection ends there (the parser reads nothing after an upgrade).
            if self._in_body:
                self._refuse(_refusal(400, "protocol upgrade not supported"))
            else:
                self._stop()
        except httptools.HttpParserError as exc:
            self._said("400 request", "invalid HTTP request refused (400): %s", exc)
            self._refuse(_refusal(400, "invalid HTTP request"))
        if self._stopped:
            return
        if self._head_bytes is not None and self._head_over(len(data)):
            self._refuse_head()
            return
        if self._grew_past_bound():
            self._over_budget()
            return
        if self._body_timer is None and (self._in_body or self._head_bytes is not None):
            # Inside a request that is not whole yet: it has body_timeout_s from here.
            self._body_timer = self._loop.call_later(self.app.body_timeout_s, self._body_late)

    def _active(self) -> None:
        """The client sent bytes: no idle timeout, and the last stalled connection to evict."""
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self.connections.active(self)

    def _head_over(self, read_bytes: int) -> bool:
        """Count a read that left a head unfinished; whether the head is past the cap."""
        assert self._head_bytes is not None  # noqa: S101 - only called inside a head
        if self._head_bytes < 0:  # the head began inside this read: the rest is not its own
            self._head_bytes = 0
        else:
            self._head_bytes += read_bytes
        return self._head_bytes > self.max_head_bytes

    def _grew_past_bound(self) -> bool:
        """Count what a read left of an unfinished head or body; whether it passed the bound."""
        held = self._size if self._in_body else max(self._head_bytes or 0, 0)
        if held == self._held:
            return False
        grew = held > self._held
        return self._hold(held) and grew

    def _hold(self, size: int) -> bool:
        """Count ``size`` unfinished bytes for this connection; whether all are past the bound."""
        unfinished = self.unfinished
        unfinished.held += size - self._held
        self._held = size
        return unfinished.held > unfinished.limit

    def pause_writing(self) -> None:
        """The socket's buffer is full: read no more requests until it drains."""
        self._write_paused = True
        self._reading()

    def resume_writing(self) -> None:
        """The socket's buffer drained."""
        self._write_paused = False
        self._reading()

    def evict(self) -> None:
        """Close this stalled connection for a new one: an unfinished request is answered 503.

        It no longer counts under the bound. Answers it has not read are dropped with the
        connection (:meth:`_drop`; each was answered after its row was durable; the sender
        sends again).
        """
        if self._transport is None:
            return
        if self._stopped:
            pass  # already closing: an answer before the close, or the idle timer
        elif self._in_body or self._head_bytes is not None:
            self._refuse(_refusal(HTTPStatus.SERVICE_UNAVAILABLE, "overloaded"))
        else:
            self._stop()
        self._drop()

    def shutdown(self) -> None:
        """The server shuts down gracefully: close now if idle, else once the answers are out."""
        self._closing = True
        self._stop()
        if not self._busy and not self._waiting and self._transport is not None:
            self._transport.close()

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        """A request starts: count its head from here.

        A head that begins inside a read, after a request that ended there (pipelining), is
        counted from the next read on, and its exact size is checked when it is whole: the
        bytes of that read before it are the other request's, not its own.
        """
        self._url = b""
        self._headers = {}
        self._head_counted = self._between
        self._head_bytes = 0 if self._between else -1
        self._between = False
        self._body = []
        self._size = 0

    def on_url(self, url: bytes) -> None:
        """Part of the request target."""
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        """One header; a repeated name keeps its last value, but trace context joins them.

        ``traceparent`` and ``tracestate`` repeats are joined with ``,``
        (:data:`~pipeline.ingress.headers.JOINED_REQUEST_HEADERS`).
        """
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if key in JOINED_REQUEST_HEADERS and key in self._headers:
            text = f"{self._headers[key]},{text}"
        self._headers[key] = text

    def on_headers_complete(self) -> None:
        """Route the request, refuse a head over the cap or a body declared too large."""
        if self._stopped:
            return
        # A head counted from its first read is no longer than what was read before this chunk
        # plus this chunk, so its exact size is only added up when that bound passes the cap.
        bound = max(self._head_bytes or 0, 0) + self._chunk_bytes
        self._head_bytes = None
        if bound > self.max_head_bytes or not self._head_counted:
            size = len(self._url) + sum(len(n) + len(v) + 4 for n, v in self._headers.items())
            if size > self.max_head_bytes:
                self._refuse_head()
                return
        parser = self._parser
        if parser is None:  # the connection is gone
            return
        try:
            url = httptools.parse_url(self._url)
        except httptools.HttpParserInvalidURLError:
            self._refuse_target()
            return
        self._raw_path = url.path
        path = url.path.decode("latin-1")
        self._path = unquote(path) if "%" in path else path
        self._query = url.query or b""
        self._method = method = parser.get_method()
        self._keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        source = self.app.webhook_source(self._path) if method == b"POST" else None
        self._source = source
        self._limit = limit = source.max_body_bytes if source is not None else None
        if limit is not None and declared_over(self._headers.get("content-length", ""), limit):
            self._too_large()
            return
        self._in_body = True
        if (
            self._headers.get("expect", "").lower() == "100-continue"
            and not self._busy
            and not self._waiting
            and self._transport is not None
        ):
            self._transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        """Body bytes, refused past the limit."""
        if self._stopped or self._limit is None:
            return
        self._size += len(body)
        if self._size > self._limit:
            self._too_large()
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        """The request is whole: answer it now, or after those before it."""
        if self._stopped:
            return
        self._in_body = False
        if self._held:
            self._hold(0)
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        body = b"".join(self._body)  # one part: that part itself, not a copy
        self._waiting.append(
            _Request(
                self._method,
                self._path,
                self._query,
                self._headers,
                body,
                self._keep_alive,
                self._source,
                raw_path=self._raw_path,
            )
        )
        if not self._busy:
            self._next()
        elif len(self._waiting) >= PIPELINE_DEPTH:
            self._reading()

    # -- refusals --------------------------------------------------------------------------

    def _too_large(self) -> None:
        """413: the body passed its source's cap (the answer names it, :func:`too_large`)."""
        source = self._source
        assert source is not None  # noqa: S101 - only a source's body has a limit
        self.app.refused_too_large(source)
        self._refuse(_refused(413, too_large(source)))

    def _over_budget(self) -> None:
        if self._source is not None:
            self.app.counters[self._source.name, "body_budget"] += 1
        limit = self.unfinished.limit
        self._said("503 unfinished", "unfinished requests over %d bytes: one refused (503)", limit)
        self._refuse(_refusal(HTTPStatus.SERVICE_UNAVAILABLE, "overloaded"))

    def _refuse_head(self) -> None:
        cap = self.max_head_bytes
        self._said("431", "request head over %d bytes refused (431)", cap)
        answer = {
            "error": "request head too large",
            "max_head_bytes": cap,
            "setting": "PIPELINE_INGRESS__MAX_HEAD_BYTES",
        }
        self._refuse(_refused(431, json.dumps(answer).encode()))

    def _refuse_target(self) -> None:
        """A request target httptools cannot read: 414 past its length, else 400."""
        if len(self._url) > MAX_TARGET_BYTES:
            self._said("414", "request target over %d bytes refused (414)", MAX_TARGET_BYTES)
            answer = {"error": "request target too long", "max_target_bytes": MAX_TARGET_BYTES}
            self._refuse(_refused(HTTPStatus.REQUEST_URI_TOO_LONG, json.dumps(answer).encode()))
        else:
            self._said("400 target", "invalid request target refused (400)")
            self._refuse(_refusal(400, "invalid HTTP request"))

    def _body_late(self) -> None:
        self._body_timer = None
        if self._stopped:
            return
        if self._in_body:
            if self._source is not None:
                self.app.refused_late(self._source)
            self._refuse(_refusal(408, "body not received in time"))
        elif self._head_bytes is not None:
            self._said("408 head", "request head not received in time refused (408)")
            self._refuse(_refusal(408, "request head not received in time"))

    def _said(self, alike: str, msg: str, *args: object) -> None:
        """The door's INFO line of a refusal, alike ones (of one ``alike`` kind) backed off."""
        self.app.refusals.log(log, f"door {alike}", msg, *args)

    def _refuse(self, refusal: _Request) -> None:
        """Answer ``refusal`` after the requests before it, read nothing more, then close."""
        self._in_body = False
        self._head_bytes = None
        self._body = []
        self._hold(0)
        self._stop()
        self._waiting.append(refusal)
        if not self._busy:
            self._next()

    def _stop(self) -> None:
        """Read no more requests on this connection."""
        self._stopped = True
        self._cancel_timers()
        self._reading()

    def _cancel_timers(self) -> None:
        for timer in (self._idle, self._body_timer, self._linger_end):
            if timer is not None:
                timer.cancel()
        self._idle = self._body_timer = self._linger_end = None

    def _reading(self) -> None:
        """Pause or resume reading for the socket's output and the requests waiting."""
        transport = self._transport
        if transport is None or transport.is_closing() or self._linger_left is not None:
            return
        pause = self._stopped or self._write_paused or len(self._waiting) >= PIPELINE_DEPTH
        if pause != self._read_paused:
            self._read_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    # -- answers ---------------------------------------------------------------------------

    def _next(self) -> None:
        """Answer the oldest waiting request; when none waits, start the idle timer."""
        transport = self._transport
        if transport is None:
            return
        if not self._waiting:
            if self._stopped:
                transport.close()
            elif not transport.is_closing():
                self._idle = self._loop.call_later(self._keep_alive_s, self._idle_out)
            return
        request = self._waiting.popleft()
        if request.refusal is not None:
            status, body = request.refusal
            headers = [_JSON, _RETRY_1] if status == HTTPStatus.SERVICE_UNAVAILABLE else [_JSON]
            self._write(request, status, headers, body)
            return
        self._busy = True
        self.connections.answering(self)  # not to be evicted while answering
        task = self._loop.create_task(self._serve(request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self._read_paused:
            self._reading()

    async def _serve(self, request: _Request) -> None:
        try:
            if request.source is not None:
                status, body, extra = await self.app.webhook(
                    request.source, request.headers, request.body
                )
                headers = [_JSON, *extra] if extra else [_JSON]
            else:
                status, headers, body = await self._asgi(request)
        except Exception:
            log.exception("request to %s failed", request.path)
            status, headers, body = 500, [_JSON], b'{"error": "internal error"}'
            request.keep_alive = False
        self._busy = False
        self.connections.answered(self)  # the last one to evict
        if self._transport is None or self._transport.is_closing():
            return
        self._write(request, status, headers, body)

    def _write(self, request: _Request, status: int, headers: Headers, body: bytes) -> None:
        transport = self._transport
        assert transport is not None  # noqa: S101 - only called once connected
        keep_alive = request.keep_alive and not self._closing
        parts = answer_head(status, headers, len(body), keep_alive=keep_alive)
        if request.method != b"HEAD":
            parts.append(body)
        transport.write(b"".join(parts))
        if not keep_alive:
            self._stopped = True
            self._waiting.clear()
            if request.refusal is None or self._closing or not transport.can_write_eof():
                transport.close()
            else:
                self._linger(transport)
            return
        self._next()

    # -- lingering close -------------------------------------------------------------------

    def _linger(self, transport: asyncio.Transport) -> None:
        """After a refusal: end this side, then read and drop what the client still sends.

        The client may be sending the rest of its request (a body the door refused): closed
        now, its bytes would be answered with a reset, and a client that reads only once it has
        sent everything would see a broken pipe instead of the refusal. The connection is closed
        when the client closes it, or after :data:`LINGER_BYTES`, :data:`LINGER_S` in all or
        :data:`LINGER_IDLE_S` of silence; until then it counts under the connection bound (the
        first to be evicted for a new one). Nothing is logged: refusals come in floods.
        """
        transport.write_eof()  # after the answer
        self.connections.done(self)  # evicted before the connections that may still ask
        # What the refused request left (a head up to its cap) is let go: the door stopped
        # counting it when it refused, and a lingering connection may live for LINGER_S more.
        self._parser = None
        self._url = b""
        self._headers = {}
        self._body = []
        self._linger_left = LINGER_BYTES
        self._linger_read = self._loop.time()
        self._linger_end = self._loop.call_later(LINGER_S, self._drop)
        self._idle = self._loop.call_later(LINGER_IDLE_S, self._linger_idle)
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()

    def _dropped(self, size: int) -> None:
        """``size`` bytes came after the refusal: dropped; closed past :data:`LINGER_BYTES`."""
        left = self._linger_left
        assert left is not None  # noqa: S101 - only called while lingering
        self._linger_left = left = left - size
        self._linger_read = self._loop.time()
        if left < 0:
            self._drop()

    def _linger_idle(self) -> None:
        """Close a lingering connection silent for :data:`LINGER_IDLE_S`; else look again then."""
        self._idle = None
        quiet_until = self._linger_read + LINGER_IDLE_S
        if self._loop.time() >= quiet_until:
            self._drop()
        elif self._transport is not None:
            self._idle = self._loop.call_at(quiet_until, self._linger_idle)

    def _idle_out(self) -> None:
        self._idle = None
        if self._transport is not None and not self._busy and not self._waiting:
            self._transport.close()

    async def _asgi(self, request: _Request) -> tuple[int, Headers, bytes]:
        """Serve a request that is not a webhook through the app's ASGI entry point."""
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "scheme": "http",
            "method": request.method.decode("latin-1"),
            "path": request.path,
            "raw_path": request.raw_path,
            "root_path": "",
            "query_string": request.query,
            "headers": [
                (name.encode("latin-1"), value.encode("latin-1"))
                for name, value in request.headers.items()
            ],
            "server": None,
            "client": None,
            "state": {},
        }
        given = False
        answer: dict[str, Any] = {"status": 500, "headers": []}
        body: list[bytes] = []

        async def receive() -> AsgiMessage:
            nonlocal given
            if given:
                return {"type": "http.disconnect"}
            given = True
            return {"type": "http.request", "body": request.body, "more_body": False}

        async def send(message: AsgiMessage) -> None:
            if message["type"] == "http.response.start":
                answer.update(status=message["status"], headers=message.get("headers", []))
            elif message["type"] == "http.response.body":
                body.append(message.get("body", b""))

        await self.app(scope, receive, send)
        headers = [
            (bytes(name), bytes(value))
            for name, value in answer["headers"]
            if bytes(name).lower() not in {b"content-length", b"connection"}
        ]
        return answer["status"], headers, b"".join(body)


def ingress_protocol(
    app: IngressApp,
    max_head_bytes: int,
    max_unfinished_body_bytes: int = MAX_UNFINISHED_BODY_BYTES,
    max_connections: int | None = None,
) -> type[IngressProtocol]:
    """The protocol class for uvicorn's ``http`` setting: ``app``'s, heads capped.

    Its connections share one bound on unfinished heads and bodies, ``max_unfinished_body_bytes``,
    and are at most ``max_connections`` (None: no bound).
    """

    def count(outcome: str) -> None:
        app.counters["", f"connection_limit:{outcome}"] += 1

    attributes: Mapping[str, Any] = {
        "app": app,
        "max_head_bytes": max_head_bytes,
        "unfinished": UnfinishedBodies(max_unfinished_body_bytes),
        "connections": OpenConnections[IngressProtocol](
            max_connections,
            bound="the bound (PIPELINE_INGRESS__MAX_CONNECTIONS)",
            log=log,
            counted=count,
        ),
    }
    return type("IngressHttp", (IngressProtocol,), dict(attributes))
