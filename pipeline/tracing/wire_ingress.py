"""A webhook request's spans and a produce's ``send`` span, written from parts kept encoded.

A :data:`~.record.WEBHOOK` record becomes its stages (``verify``, ``log commit``) and the
request's SERVER span; a :data:`~.record.SEND` record one PRODUCER span. Their names, kinds and
most attributes are the same for every request of one source, or every record sent to one topic
over one system; only the ids, the times, the tenant and the key change. As
:mod:`.wire_delivery` does for deliveries, the functions here keep the parts that repeat
encoded and join them with the ones that change: the bytes :func:`.otlp.span` writes for the
spans :meth:`.export.Spans.of` makes (the tests compare both with the SDK's encoder).

A record with something the kept parts do not cover (a request attribute that would replace
one of the request span's own) returns None, and the caller encodes it field by field.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pipeline.tracing import otlp
from pipeline.tracing.record import Record, SendRecord, WebhookRecord, new_span_id
from pipeline.tracing.wire_delivery import KAFKA_KEY, span_id_bytes, utf8, wire_context

_INTERNAL = otlp.KIND["internal"]
_SERVER_KEYS = frozenset({"http.request.method", "http.route", "pipeline.source"})
"""The request span's own attributes, in :meth:`.export.Spans._webhook`'s order."""


@dataclass(frozen=True, slots=True)
class _Kept:
    """The encoded name, kind and attributes that repeat in one kind of span.

    The SERVER span of one source's requests, or the PRODUCER span of one topic's sends over one
    system.
    """

    name_kind: bytes
    attributes: bytes


@functools.lru_cache(maxsize=1024)
def _request(source: str) -> _Kept:
    return _Kept(
        name_kind=otlp.name_and_kind(f"POST /hooks/{source}", otlp.KIND["server"]),
        attributes=b"".join(
            (
                otlp.attribute("http.request.method", "POST"),
                otlp.attribute("http.route", "/hooks/{source}"),
                otlp.attribute("pipeline.source", source),
            )
        ),
    )


@functools.lru_cache(maxsize=64)
def _stage(name: str) -> bytes:
    return otlp.name_and_kind(name, _INTERNAL)


def webhook_spans(record: Record) -> list[bytes] | None:
    """The encoded spans of a ``WEBHOOK`` record (stages, then the request), or None.

    None when the request's attributes set one of the request span's own
    (``http.route`` and the like): :meth:`.export.Spans._webhook` lets them replace it in place.
    """
    w = WebhookRecord(*record)
    extra = w.attributes
    if extra and not _SERVER_KEYS.isdisjoint(extra):
        return None
    trace = otlp.TRACE_ID_TAG + w.trace_id.to_bytes(16, "big")
    span_id = span_id_bytes(w.span_id)
    out = [
        otlp.joined_span(
            trace,
            span_id_bytes(new_span_id()),
            span_id,
            _stage(name),
            start,
            end,
            otlp.span_events(events) + otlp.status(error) if events or error else b"",
        )
        for name, start, end, error, events in w.stages
    ]
    parts = _request(w.source)
    tail = parts.attributes
    if extra:
        tail += otlp.attributes(9, extra)
    if w.events or w.error:
        tail += otlp.span_events(w.events) + otlp.status(w.error)
    parent = span_id_bytes(w.parent_id) if w.parent_id else b""
    out.append(otlp.joined_span(trace, span_id, parent, parts.name_kind, w.start, w.end, tail))
    return out


@functools.lru_cache(maxsize=1024)
def _send(system: str, topic: str) -> _Kept:
    return _Kept(
        name_kind=otlp.name_and_kind(f"send {topic}", otlp.KIND["producer"]),
        attributes=b"".join(
            (
                otlp.attribute("messaging.system", system),
                otlp.attribute("messaging.operation.type", "send"),
                otlp.attribute("messaging.operation.name", "send"),
                otlp.attribute("messaging.destination.name", topic),
            )
        ),
    )


def send_span(record: Record) -> bytes:
    """The encoded PRODUCER span of a ``SEND`` record."""
    s = SendRecord(*record)
    parts = _send(s.system, s.topic)
    tail = parts.attributes
    if s.key is not None:
        tail += otlp.utf8_attribute(KAFKA_KEY, utf8(s.key))
    if s.events or s.error:
        tail += otlp.span_events(s.events) + otlp.status(s.error)
    trace_id, parent = wire_context(s.carried)
    return otlp.joined_span(
        otlp.TRACE_ID_TAG + trace_id,
        span_id_bytes(s.span_id),
        parent,
        parts.name_kind,
        s.start,
        s.end,
        tail,
    )
