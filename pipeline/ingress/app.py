"""The ingress ASGI application: ``POST /hooks/{source}`` and Meta's ``GET`` handshake.

``HEAD`` is answered as ``GET`` (the server drops the body); another method is **405**
``Allow: GET, HEAD, POST``.

A plain ASGI callable (no framework routing: two routes do not need one, and the hot path stays
a few function calls deep). Per POST, in this order:

1. the body, capped at ``max_body_bytes``, else **413** (Content-Length is checked first; the
   body names the cap and its setting, :func:`too_large`), and
   read within ``body_timeout_s``, else **408** (a client that goes away mid-body gets nothing
   and nothing is stored); while the heads and bodies left unfinished on all connections are
   past ``max_unfinished_bytes``, **503** (:mod:`pipeline.ingress.http`);
2. admission: a slot of the source, else **503** with Retry-After (counted as shed); the slot is
   taken only once the whole body is in, so idle or slow bodies cannot hold the slots;
3. verification of the raw bytes, else **401** (counted by reason; nothing stored); a header the
   scheme reads longer than :data:`~pipeline.ingress.verify.protocol.MAX_SIGNATURE_HEADER_CHARS`
   is refused before any HMAC is computed;
4. extraction of tenant, key, event id and the route, else **400** (values must be UTF-8
   without NUL and at most :data:`~pipeline.ingress.values.MAX_VALUE_CHARS` characters; JSON
   nested too deeply is refused);
5. a body above its lane's ``offload.above`` written to the payload store (else **503**),
   the row keeping the reference (:mod:`pipeline.offload.rows`); then insert into the log
   store, unique on (source, event id), group-committed and durable;
   a redelivery inserts nothing and is answered **200** ``duplicate``;
6. **200** ``accepted`` with the row id, then the event is produced in the background.

Each refusal (400, 401, 403, 405, 408, 413) logs one INFO line naming the source and the reason
(``webhook refused from source S: REASON``; a 403 says why the handshake was refused, never the
token; a 405 names the method, cut and escaped). A 404 logs ``webhook refused: no source named
'NAME' (sources: ...)`` (a provider configured with a wrong URL), or for a path outside
``/hooks/`` ``request refused: no such path 'PATH' (...)``, what the request sent cut at 64
characters and escaped, the sources listed cut. Alike lines are backed off
(:class:`~pipeline.ingress.refusals.Refusals`), so a flood of bad requests is a few lines;
they are alike by a repeat key from a bounded set (a configured source and a reason, or one
key for all 404s of unknown sources and one for other paths), so a flood of random paths keeps
nothing per path.

A log store failure is answered 503: the row is not durable, so the provider must retry (and the
ingress tells :attr:`IngressApp.log_failed`, which turns ``/readyz`` 503 until the log writes).
Oversized request heads are refused by the HTTP layer (431, :mod:`pipeline.ingress.http`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

from pipeline import tracing
from pipeline.errors import ConfigError
from pipeline.ingress.dispatch import Dispatcher
from pipeline.ingress.errors import Malformed, Rejected, SchemaMismatch, TooLarge
from pipeline.ingress.headers import JOINED_REQUEST_HEADERS
from pipeline.ingress.refusals import Refusals, listed, quoted
from pipeline.ingress.schemas import LaneSchemas
from pipeline.ingress.source import Source
from pipeline.ingress.verify.protocol import MAX_SIGNATURE_HEADER_CHARS
from pipeline.logstore import IngressLog, LogStoreError, NewRow
from pipeline.observability.server import PATHS as OBSERVER_PATHS
from pipeline.offload.errors import OffloadError
from pipeline.offload.writer import HASH_OFF_LOOP_BYTES, sha256_hex

log = logging.getLogger(__name__)

Scope = dict[str, Any]
AsgiMessage = dict[str, Any]
Receive = Callable[[], Awaitable[AsgiMessage]]
Send = Callable[[AsgiMessage], Awaitable[None]]

Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]
"""A webhook's answer: status, JSON body, and headers besides content type and length."""

_PREFIX = "/hooks/"
_JSON = [(b"content-type", b"application/json")]
_CLOSE = (b"connection", b"close")
_RETRY_5 = (b"retry-after", b"5")
_GET = ("GET", "HEAD")  # Meta's handshake, answered on any source (403 without a verify token)
_ALLOW = b"GET, HEAD, POST"
# The answers every webhook may get, encoded once (as json.dumps would write them).
_ACCEPTED = b'{"status": "accepted", "id": "%s"}'  # a row id is hex: nothing to escape
_DUPLICATE = b'{"status": "duplicate"}'
_UNAUTHORIZED = b'{"error": "unauthorized"}'
_OVERLOADED = b'{"error": "overloaded"}'


class Disconnected(Exception):
    """The client went away before the whole body was in."""


class IngressApp:
    """Serves every configured source; counts outcomes in :attr:`counters`."""

    def __init__(
        self,
        sources: Mapping[str, Source],
        log_store: IngressLog,
        dispatcher: Dispatcher | None,
        *,
        clock: Callable[[], float] = time.time,
        lifespan: Callable[[], Awaitable[None]] | None = None,
        shutdown: Callable[[], Awaitable[None]] | None = None,
        body_timeout_s: float = 10.0,
    ) -> None:
        """Serve ``sources``; rows go to ``log_store``, then to ``dispatcher`` (None: no produce).

        ``lifespan`` and ``shutdown`` run on the ASGI lifespan startup and shutdown events.
        A body not fully received within ``body_timeout_s`` of the request is answered 408.
        """
        self._body_timeout_s = body_timeout_s
        self._sources = dict(sources)
        self._names = listed(self._sources)  # for the 404's line, cut (forty sources are many)
        self._log = log_store
        self.dispatcher = dispatcher
        """Where accepted rows go to be produced; None produces nothing (the sweeper will)."""
        self._clock = clock
        self._startup = lifespan
        self._shutdown = shutdown
        self.counters: Counter[tuple[str, str]] = Counter()
        """Requests by (source, outcome): accepted, duplicate, rejected:<reason>, shed, ..."""
        self.schemas: LaneSchemas | None = None
        """Checks payloads of lanes that require a registered schema, when set."""
        self.observer: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None
        """Serves ``/metrics``, ``/healthz`` and ``/readyz`` when set (a ``MetricsServer``)."""
        self.offload: Callable[[NewRow, str | None], Awaitable[NewRow]] | None = None
        """Writes a large body to its lane's payload store and returns the reference row (given
        the body's SHA-256 when it was computed already: a large body is hashed once)."""
        self.log_failed: Callable[[LogStoreError], None] | None = None
        """Told of each insert the log store failed (the ingress turns unready), when set."""
        self.refusals = Refusals()
        """Logs the refusals of this app and of its HTTP layer, alike ones backed off."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if self.observer is not None and path in OBSERVER_PATHS:
            await self.observer(scope, receive, send)
            return
        source = self.webhook_source(path)
        method: str = scope["method"]
        if source is None:
            self.refused_path(path)
            await _answer(send, 404, {"error": "unknown source"})
        elif method == "POST":
            await self._post(source, scope, receive, send)
        elif method in _GET:  # the server sends no body for HEAD (RFC 9110 9.3.2)
            await self._handshake(source, scope, send)
        else:
            allowed = f"{quoted(method)}; allowed: {_ALLOW.decode()}"
            self.refused(source, "method not allowed", f" ({allowed})")
            await _answer(send, 405, {"error": "method not allowed"}, [(b"allow", _ALLOW)])

    def webhook_source(self, path: str) -> Source | None:
        """The source a ``POST`` to ``path`` delivers to, or None (404)."""
        return self._sources.get(path[len(_PREFIX) :]) if path.startswith(_PREFIX) else None

    @property
    def body_timeout_s(self) -> float:
        """How long a request's body may take to arrive after its head (else 408)."""
        return self._body_timeout_s

    def refused(self, source: Source, reason: str, detail: str = "") -> None:
        """Log ``source``'s refusal for ``reason`` (``detail`` follows it), alike ones backed off.

        The HTTP layer (:mod:`pipeline.ingress.http`) logs its 413 and 408 through this too.
        """
        self.refusals.log(
            log,
            f"refused {source.name}: {reason}",
            "webhook refused from source %s: %s%s",
            source.name,
            reason,
            detail,
            extra={"source": source.name, "reason": reason},
        )

    def refused_path(self, path: str) -> None:
        """Log a 404: the unknown source (or path) named, cut and escaped, and the sources.

        A provider configured with a wrong URL (``/hooks/githb``) is told only by this line.
        Judged by one fixed repeat key for unknown sources and one for other paths, never by
        the path: a flood of random paths is a few lines, and keeps nothing of each.
        """
        if path.startswith(_PREFIX):
            self.refusals.log(
                log,
                "door 404 source",
                "webhook refused: no source named %s (sources: %s)",
                quoted(path[len(_PREFIX) :]),
                self._names,
            )
        else:
            self.refusals.log(
                log,
                "door 404 path",
                "request refused: no such path %s (webhooks are POST %s<source>; sources: %s)",
                quoted(path),
                _PREFIX,
                self._names,
            )

    def refused_too_large(self, source: Source) -> None:
        """Count and log a body over ``source``'s cap (the 413 of :func:`too_large`)."""
        self.counters[source.name, "too_large"] += 1
        setting = f"sources.{source.name}.max_body_bytes"
        self.refused(source, "body too large", f" (over {source.max_body_bytes} bytes, {setting})")

    def refused_late(self, source: Source) -> None:
        """Count and log a body not received within :attr:`body_timeout_s` (a 408)."""
        self.counters[source.name, "body_timeout"] += 1
        self.refused(source, "body not received in time")

    async def _post(self, source: Source, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        if declared_over(headers.get("content-length", ""), source.max_body_bytes):
            self.refused_too_large(source)
            await _send(send, 413, too_large(source), _JSON)
            return
        try:
            async with asyncio.timeout(self._body_timeout_s):
                body = await _read_body(receive, source.max_body_bytes)
        except TooLarge:
            self.refused_too_large(source)
            await _send(send, 413, too_large(source), _JSON)
            return
        except TimeoutError:
            self.refused_late(source)
            await _answer(send, 408, {"error": "body not received in time"}, [_CLOSE])
            return
        except Disconnected:
            self.counters[source.name, "disconnected"] += 1
            return
        status, answer, extra = await self.webhook(source, headers, body)
        await _send(send, status, answer, [*_JSON, *extra])

    async def webhook(self, source: Source, headers: Mapping[str, str], body: bytes) -> Answer:
        """Steps 2 to 6 for a whole body: admission, then the accept path; the answer to send.

        ``headers`` are the request's, names in lower case. The HTTP layer
        (:mod:`pipeline.ingress.http`) calls this directly, with the body read and its size
        checked; the ASGI entry point calls it after step 1.
        """
        admission = source.admission
        if not await admission.acquire():
            self.counters[source.name, "shed"] += 1
            retry_after = str(admission.retry_after_s()).encode()
            return 503, _OVERLOADED, [(b"retry-after", retry_after)]
        completed = False  # a 503 of a failing store is no drain: the Retry-After must grow
        try:
            with tracing.webhook(source.name, headers):
                answer = await self._accept(source, headers, body)
            completed = answer[0] != HTTPStatus.SERVICE_UNAVAILABLE
            return answer
        finally:
            admission.release(completed=completed)

    async def _accept(  # noqa: C901, PLR0911 - one branch per answer of the module docstring
        self, source: Source, headers: Mapping[str, str], body: bytes
    ) -> Answer:
        now_s = self._clock()
        try:
            _bounded_signature_headers(headers, source.verifier.headers)
            with tracing.stage("verify"):
                source.verifier.verify(headers, body, now_s)
        except Rejected as exc:
            self.counters[source.name, f"rejected:{exc.reason}"] += 1
            self.refusals.log(
                log,
                f"rejected {source.name}: {exc.reason}",
                "webhook rejected from source %s: %s",
                source.name,
                exc.reason,
                extra={"source": source.name, "reason": exc.reason},
            )
            return 401, _UNAUTHORIZED, []
        except Exception:
            # A verifier bug must never let a request through: fail closed.
            self.counters[source.name, "rejected:verifier error"] += 1
            log.exception(
                "verifier of source %s failed", source.name, extra={"source": source.name}
            )
            return 401, _UNAUTHORIZED, []
        digest = None  # a large body where lanes offload: hashed once, off the loop
        if self.offload is not None and len(body) >= HASH_OFF_LOOP_BYTES:
            digest = await sha256_hex(body)  # the event id (without one) and the object key
        try:
            row = source.build_row(headers, body, now_s, body_sha256=digest)
            if self.schemas is not None:
                self.schemas.check(row.lane, body)
        except Malformed as exc:
            self.counters[source.name, f"malformed:{exc.reason}"] += 1
            self.refused(source, exc.reason)
            return 400, _encode(_malformed(exc)), []
        if self.offload is not None:  # a large body goes to its store first (durable before 2xx)
            try:
                row = await self.offload(row, digest)
            except OffloadError as exc:
                self.counters[source.name, "offload_error"] += 1
                # A known failure: what and why on one line (repeats back off), no traceback.
                log.error(  # noqa: TRY400
                    "payload store write failed on source %s: %s",
                    source.name,
                    exc,
                    extra={"source": source.name},
                )
                return 503, _encode({"error": "payload store unavailable"}), [_RETRY_5]
        try:
            with tracing.stage("log commit"):
                inserted = await self._log.insert(row)
        except LogStoreError as exc:
            self.counters[source.name, "store_error"] += 1
            # A known failure: what and why on one line (repeats back off), no traceback.
            log.error(  # noqa: TRY400
                "log store insert failed on source %s: %s",
                source.name,
                exc,
                extra={"source": source.name},
            )
            if self.log_failed is not None:
                self.log_failed(exc)
            return 503, _encode({"error": "log store unavailable"}), [_RETRY_5]
        if not inserted:
            self.counters[source.name, "duplicate"] += 1
            return 200, _DUPLICATE, []
        self.counters[source.name, "accepted"] += 1
        if self.dispatcher is not None:
            self.dispatcher.submit(row)
        return 200, _ACCEPTED % row.id.encode(), []

    async def _handshake(self, source: Source, scope: Scope, send: Send) -> None:
        """Meta's subscription check: echo ``hub.challenge`` when the verify token matches."""
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        mode = query.get("hub.mode", [""])[0]
        token = query.get("hub.verify_token", [""])[0]
        challenge = query.get("hub.challenge", [""])[0]
        expected = source.verify_token
        if expected is not None and mode == "subscribe" and challenge and _same(token, expected):
            self.counters[source.name, "handshake"] += 1
            await _send(send, 200, challenge.encode(), [(b"content-type", b"text/plain")])
            return
        self.counters[source.name, "handshake_refused"] += 1
        self.refused(source, "handshake refused", f" ({_why_refused(source, mode, challenge)})")
        await _answer(send, 403, {"error": "forbidden"})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self._startup is not None:
                        await self._startup()
                except ConfigError as exc:
                    log.error("ingress start failed: %s", exc)  # noqa: TRY400 - one line, no traceback
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                except Exception as exc:
                    log.exception("ingress start failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._shutdown is not None:
                    await self._shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _bounded_signature_headers(headers: Mapping[str, str], names: tuple[str, ...]) -> None:
    """Refuse (401) a header the scheme reads that is longer than any real one."""
    if any(len(headers.get(name, "")) > MAX_SIGNATURE_HEADER_CHARS for name in names):
        raise Rejected("signature header too large")


def declared_over(content_length: str, limit: int) -> bool:
    """Whether a Content-Length header declares more than ``limit`` bytes.

    Never parses 5,000 digits: a number longer than the limit's is over it.
    """
    if not (content_length.isascii() and content_length.isdigit()):
        return False
    return len(content_length) > len(str(limit)) or int(content_length) > limit


def too_large(source: Source) -> bytes:
    """The 413 body of ``source``: the cap its body passed, and the setting that raises it.

    The provider's delivery log then tells the operator what to change (the sources file's
    ``sources.<name>.max_body_bytes``). Built on the refusal only: no cost to other requests.
    """
    answer = {
        "error": "body too large",
        "max_body_bytes": source.max_body_bytes,
        "setting": f"sources.{source.name}.max_body_bytes",
    }
    return json.dumps(answer).encode()


def _why_refused(source: Source, mode: str, challenge: str) -> str:
    """Why a handshake whose query has ``mode`` and ``challenge`` was refused (no token shown)."""
    if source.verify_token is None:
        return f"no verify_token is set: sources.{source.name}.verify_token"
    if mode != "subscribe":
        return "hub.mode is not 'subscribe'"
    if not challenge:
        return "no hub.challenge"
    return "hub.verify_token is not the source's verify_token"


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers; a repeated name keeps its last value, but trace context joins them.

    ``traceparent`` and ``tracestate`` repeats are joined with ``,``
    (:data:`~pipeline.ingress.headers.JOINED_REQUEST_HEADERS`), as the HTTP layer does.
    """
    out: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        if name in JOINED_REQUEST_HEADERS and name in out:
            value = f"{out[name]},{value}"
        out[name] = value
    return out


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _malformed(exc: Malformed) -> dict[str, str]:
    """The 400 body: the counted reason, and for a schema mismatch the field at fault."""
    if isinstance(exc, SchemaMismatch):
        return {"error": exc.reason, "detail": exc.detail}
    return {"error": exc.reason}


def _encode(body: Mapping[str, str]) -> bytes:
    return json.dumps(body).encode()


async def _answer(
    send: Send, status: int, body: Mapping[str, str], extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    await _send(send, status, _encode(body), [*_JSON, *(extra or [])])


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
