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
from typing import Any

from pipeline.tracing import otlp
from pipeline.tracing.record import Record, new_span_id, new_trace_id, parse

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
    (
        _,
        carried,
        produced,
        entered,
        admitted,
        keys,
        priority,
        guard_id,
        guard_start,
        guard_end,
        handler_start,
        handler_end,
        failure,
        end,
        system,
        topic,
        partition,
        offset,
        lane,
        attempt,
        count,
        tenant,
        key,
        outcome,
        events,
        guard_events,
    ) = record
    trace_id, parent_id = _context(carried)
    process_id = new_span_id()
    if guard_start and not guard_id:
        guard_id = new_span_id()
    parts = _parts(system, topic, partition, lane)
    trace = b"\x0a\x10" + trace_id.to_bytes(16, "big")
    waited_from = min(produced, entered) if produced else entered
    out = [
        _span(
            trace,
            new_span_id(),
            parent_id or process_id,
            parts.wait,
            waited_from,
            entered,
            parts.partition,
        )
    ]
    attributes = _process_attributes(
        parts, partition, offset, attempt, count, tenant, key, outcome, events
    )
    out.append(_span(trace, process_id, parent_id, parts.process, entered, end, attributes))
    if keys is not None and admitted:
        throttle = {"pipeline.throttle.keys": list(keys), "pipeline.throttle.priority": priority}
        out.append(
            _span(
                trace,
                new_span_id(),
                process_id,
                _THROTTLE,
                entered,
                max(admitted, entered),
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
                guard_start,
                guard_end or end,
                otlp.span_events(guard_events),
            )
        )
    if handler_start:
        tail = parts.lane
        if failure:
            tail += otlp.span_events([failure[1]]) + otlp.status(failure[0])
        out.append(
            _span(
                trace,
                new_span_id(),
                guard_id or process_id,
                _HANDLER,
                handler_start,
                handler_end,
                tail,
            )
        )
    return out


def _context(carried: tuple[int, int] | bytes | str | None) -> tuple[int, int]:
    """Trace id and parent span id: parsed by the traced process, from the traceparent, or new."""
    if isinstance(carried, tuple):
        return carried
    parsed = parse(carried)
    return (parsed[0], parsed[1]) if parsed else (new_trace_id(), 0)


def _process_attributes(
    parts: _Parts,
    partition: int,
    offset: int,
    attempt: bytes | None,
    count: int,
    tenant: bytes | None,
    key: bytes | None,
    outcome: str | None,
    events: list[tuple[str, int, dict[str, Any] | None]] | None,
) -> bytes:
    """The process span's attributes, events and status, in :class:`.export.Spans`' order."""
    attributes = [
        parts.destination,
        otlp.string_attribute(_MESSAGE_ID, f"{partition}-{offset}"),
        parts.lane,
        otlp.attribute("pipeline.attempt", int_or(attempt, 1)),
        otlp.attribute("pipeline.delivery_count", count),
    ]
    if tenant:
        attributes.append(otlp.attribute("pipeline.tenant", tenant.decode(errors="replace")))
    if parts.kafka:
        attributes.append(otlp.int_attribute(_OFFSET, offset))
    if key is not None:
        attributes.append(otlp.string_attribute(_KEY, key.decode(errors="replace")))
    attributes.append(otlp.attribute("pipeline.outcome", outcome or "unrouted"))
    attributes.append(otlp.span_events(events))
    if outcome is None:
        attributes.append(_UNROUTED)
    return b"".join(attributes)


def int_or(raw: bytes | None, default: int) -> int:
    """``raw`` (a header's value) as an int, or ``default`` if absent or not a number."""
    try:
        return int(raw) if raw is not None else default
    except ValueError:
        return default
