"""An OTLP/HTTP trace receiver of the test suite's own: it decodes the real protobuf.

It listens on a free loopback port in a thread, answers ``POST /v1/traces`` as a collector
does, and keeps every span it was sent (decoded with ``opentelemetry-proto``) and the raw
request bodies (which a test may forward to Jaeger).
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto


@dataclass(frozen=True)
class Span:
    """One received span, with ids as hex strings ("" for no parent)."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    service: str
    attributes: dict[str, Any] = field(default_factory=dict)
    events: tuple[str, ...] = ()
    links: tuple[tuple[str, str], ...] = ()
    error: bool = False


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def decode(body: bytes) -> list[Span]:
    """The spans of one ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            spans.extend(
                Span(
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_id=span.parent_span_id.hex(),
                    name=span.name,
                    kind=SpanProto.SpanKind.Name(span.kind),
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    service=str(resource.get("service.name", "")),
                    attributes={a.key: _value(a.value) for a in span.attributes},
                    events=tuple(e.name for e in span.events),
                    links=tuple((ln.trace_id.hex(), ln.span_id.hex()) for ln in span.links),
                    error=span.status.code == span.status.STATUS_CODE_ERROR,
                )
                for span in scope_spans.spans
            )
    return spans


class _Server(ThreadingHTTPServer):
    block_on_close = False
    """Closing does not wait for the threads of connections a client still keeps open."""


class OtlpReceiver:
    """Receives OTLP/HTTP protobuf traces on ``endpoint`` until :meth:`close`."""

    def __init__(self) -> None:
        """Listen on a free loopback port (in a daemon thread)."""
        self.spans: list[Span] = []
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        """Each export request's headers (names in lower case)."""
        self.peers: list[tuple[str, int]] = []
        """Each export request's client address: requests on one kept connection share one."""
        self._keeping = True
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # connections are kept, as collectors keep them

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    raw = gzip.decompress(raw)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver.add(
                    raw, {k.lower(): v for k, v in self.headers.items()}, self.client_address
                )
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_args: object) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """The traces URL (for ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1/traces"

    def add(
        self, body: bytes, headers: dict[str, str] | None = None, peer: tuple[str, int] = ("", 0)
    ) -> None:
        """Keep one export request: its raw body, headers, client address and decoded spans."""
        spans = decode(body)
        with self._lock:
            if not self._keeping:
                return
            self.bodies.append(body)
            self.headers.append(headers or {})
            self.peers.append(peer)
            self.spans.extend(spans)

    def let_go(self) -> None:
        """Drop what was received and keep nothing received from now on (still answering).

        A test that looks for what holds a value once its spans were received: a late export
        request (another batch of the same spans' process) is answered and not kept.
        """
        with self._lock:
            self._keeping = False
            self.spans.clear()
            self.bodies.clear()
            self.headers.clear()
            self.peers.clear()

    def traces(self) -> dict[str, list[Span]]:
        """Received spans by trace id, each trace in start order."""
        with self._lock:
            spans = list(self.spans)
        out: dict[str, list[Span]] = {}
        for span in sorted(spans, key=lambda s: s.start_ns):
            out.setdefault(span.trace_id, []).append(span)
        return out

    def close(self) -> None:
        """Stop listening."""
        self._server.shutdown()
        self._server.server_close()
