"""A delivery's spans written straight as OTLP ``Span`` messages, from parts kept encoded.

A :data:`~.record.DELIVERY` record becomes up to five spans (partition wait, process, throttle
wait, guard, handler). Their names, kinds and most attributes are the same for every message of
one topic partition and lane; only the ids, the times and a few values (offset, key, attempt,
outcome) change. :func:`delivery_spans` keeps the parts that repeat encoded, per topic
partition and lane, and joins them with the ones that change: the bytes :func:`.otlp.span`
writes for the spans :meth:`.export.Spans.of` makes (the tests compare both with the SDK's
encoder), for a fraction of the CPU time. On a host whose cores the traced process shares with
the exporting one, that time is taken from the traced process.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass

from pipeline.tracing import otlp
from pipeline.tracing.record import DeliveryRecord, Record, new_span_id, new_trace_id, parse

_ID = struct.Struct(">Q").pack
_START_END = otlp.TIMES.pack
_FLAGS = otlp.FLAGS
_UNROUTED = otlp.status("could not be routed; delivered again")
_INTERNAL = otlp.KIND["internal"]

_MESSAGE_ID = otlp.attribute_key("messaging.message.id")
_OFFSET = otlp.attribute_key("messaging.kafka.offset")
_KEY = otlp.attribute_key("messaging.kafka.message.key")
_GUARD = otlp.name_and_kind("guard", _INTERNAL)
_HANDLER = otlp.name_and_kind("handler", _INTERNAL)
_THROTTLE = otlp.name_and_kind("throttle wait", _INTERNAL)


@dataclass(frozen=True, slots=True)
class _Parts:
    """The encoded parts of the spans of one topic partition's deliveries to one lane."""

    wait: bytes
    """Partition wait: name and kind."""
    partition: bytes
    """Partition wait's one attribute, the partition; also the process span's fifth."""
    process: bytes
    """Process: name and kind."""
    destination: bytes
    """Process: the attributes before the message id (system, operation, topic, partition)."""
    lane: bytes
    """Process and handler: the ``pipeline.lane`` attribute."""
    kafka: bool
    """Whether the process span carries the Kafka offset."""


@functools.lru_cache(maxsize=4096)
def _parts(system: str, topic: str, partition: int, lane: str) -> _Parts:
    partition_id = otlp.attribute("messaging.destination.partition.id", str(partition))
    destination = (
        otlp.attribute("messaging.system", system),
        otlp.attribute("messaging.operation.type", "process"),
        otlp.attribute("messaging.operation.name", "process"),
        otlp.attribute("messaging.destination.name", topic),
        partition_id,
    )
    return _Parts(
        wait=otlp.name_and_kind("partition wait", _INTERNAL),
        partition=partition_id,
        process=otlp.name_and_kind(f"process {topic}", otlp.KIND["consumer"]),
        destination=b"".join(destination),
        lane=otlp.attribute("pipeline.lane", lane),
        kafka=system == "kafka",
    )


def _span(
    trace: bytes,
    span_id: int,
    parent_id: int,
    name_kind: bytes,
    start: int,
    end: int,
    tail: bytes = b"",
) -> bytes:
    """One span, as the ``spans`` field of a ``ScopeSpans``.

    ``trace`` is its trace id field and ``tail`` its attributes, events and status, encoded.
    """
    parent = b"\x22\x08" + _ID(parent_id) if parent_id else b""
    size = len(trace) + len(parent) + len(name_kind) + len(tail) + _FIXED_SIZE
    return b"".join(
        (
            b"\x12" + otlp.varint(size),
            trace,
            b"\x12\x08",
            _ID(span_id),
            parent,
            name_kind,
            _START_END(0x39, start, 0x41, end),
            tail,
            _FLAGS,
        )
    )


_FIXED_SIZE = 2 + 8 + otlp.TIMES.size + len(_FLAGS)
"""The bytes of every span of a delivery but its trace id, parent, name, kind and tail."""


def delivery_spans(record: Record) -> list[bytes]:
    """The encoded spans of a ``DELIVERY`` record, in the order :class:`.export.Spans` gives."""
    d = DeliveryRecord(*record)
    trace_id, parent_id = trace_context(d.carried)
    process_id = new_span_id()
    guard_id = d.guard_id or (new_span_id() if d.guard_start else 0)
    parts = _parts(d.system, d.topic, d.partition, d.lane)
    trace = b"\x0a\x10" + trace_id.to_bytes(16, "big")
    waited_from = min(d.produced, d.entered) if d.produced else d.entered
    out = [
        _span(
            trace,
            new_span_id(),
            parent_id or process_id,
            parts.wait,
            waited_from,
            d.entered,
            parts.partition,
        )
    ]
    attributes = _process_attributes(parts, d)
    out.append(_span(trace, process_id, parent_id, parts.process, d.entered, d.end, attributes))
    if d.keys is not None and d.admitted:
        throttle = {
            "pipeline.throttle.keys": list(d.keys),
            "pipeline.throttle.priority": d.priority,
        }
        out.append(
            _span(
                trace,
                new_span_id(),
                process_id,
                _THROTTLE,
                d.entered,
                max(d.admitted, d.entered),
                otlp.attributes(9, throttle),
            )
        )
    if guard_id:
        out.append(
            _span(
                trace,
                guard_id,
                process_id,
                _GUARD,
                d.guard_start,
                d.guard_end or d.end,
                otlp.span_events(d.guard_events),
            )
        )
    if d.handler_start:
        tail = parts.lane
        if d.failure:
            tail += otlp.span_events([d.failure[1]]) + otlp.status(d.failure[0])
        out.append(
            _span(
                trace,
                new_span_id(),
                guard_id or process_id,
                _HANDLER,
                d.handler_start,
                d.handler_end,
                tail,
            )
        )
    return out


def trace_context(carried: tuple[int, int] | bytes | str | None) -> tuple[int, int]:
    """A delivery's trace id and parent span id: parsed already, from its traceparent, or new."""
    if isinstance(carried, tuple):
        return carried
    parsed = parse(carried)
    return (parsed[0], parsed[1]) if parsed else (new_trace_id(), 0)


def _process_attributes(parts: _Parts, d: DeliveryRecord) -> bytes:
    """The process span's attributes, events and status, in :class:`.export.Spans`' order."""
    attributes = [
        parts.destination,
        otlp.string_attribute(_MESSAGE_ID, f"{d.partition}-{d.offset}"),
        parts.lane,
        otlp.attribute("pipeline.attempt", int_or(d.attempt, 1)),
        otlp.attribute("pipeline.delivery_count", d.delivery_count),
    ]
    if d.tenant:
        attributes.append(otlp.attribute("pipeline.tenant", d.tenant.decode(errors="replace")))
    if parts.kafka:
        attributes.append(otlp.int_attribute(_OFFSET, d.offset))
    if d.key is not None:
        attributes.append(otlp.string_attribute(_KEY, d.key.decode(errors="replace")))
    attributes.append(otlp.attribute("pipeline.outcome", d.outcome or "unrouted"))
    attributes.append(otlp.span_events(d.events))
    if d.outcome is None:
        attributes.append(_UNROUTED)
    return b"".join(attributes)


def int_or(raw: bytes | None, default: int) -> int:
    """``raw`` (a header's value) as an int, or ``default`` if absent or not a number."""
    try:
        return int(raw) if raw is not None else default
    except ValueError:
        return default
