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

import binascii
import functools
import struct
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeVar

from pipeline.tracing import otlp
from pipeline.tracing.record import (
    TRACEPARENT_CHARS,
    DeliveryRecord,
    Record,
    new_span_id,
    new_trace_id,
    parse,
)

span_id_bytes = struct.Struct(">Q").pack
"""A span id's eight bytes, as a span writes them."""
_UNROUTED = otlp.status("could not be routed; delivered again")
_INTERNAL = otlp.KIND["internal"]

_MESSAGE_ID = otlp.attribute_key("messaging.message.id")
_TENANT = otlp.attribute_key("pipeline.tenant")
_OFFSET = otlp.attribute_key("messaging.kafka.offset")
KAFKA_KEY = otlp.attribute_key("messaging.kafka.message.key")
_GUARD = otlp.name_and_kind("guard", _INTERNAL)
_HANDLER = otlp.name_and_kind("handler", _INTERNAL)
_THROTTLE = otlp.name_and_kind("throttle wait", _INTERNAL)


K = TypeVar("K", bound=Hashable)


class _Kept(dict[K, bytes]):
    """Encoded attributes by the value they encode, made on first use (a few hundred at most).

    Attempts, delivery counts and outcomes take a handful of values: a dictionary lookup is
    cheaper than encoding them again, or than ``functools.lru_cache``'s call.
    """

    def __init__(self, make: Callable[[K], bytes]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, value: K) -> bytes:
        if len(self) >= _KEPT_MAX:
            self.clear()
        encoded = self[value] = self._make(value)
        return encoded


_KEPT_MAX = 1024


def _attempt(raw: bytes | None) -> bytes:
    return otlp.attribute("pipeline.attempt", int_or(raw, 1))


def _delivery_count(count: int) -> bytes:
    return otlp.attribute("pipeline.delivery_count", count)


def _outcome(outcome: str | None) -> bytes:
    return otlp.attribute("pipeline.outcome", outcome or "unrouted")


_ATTEMPTS: _Kept[bytes | None] = _Kept(_attempt)
_COUNTS: _Kept[int] = _Kept(_delivery_count)
_OUTCOMES: _Kept[str | None] = _Kept(_outcome)


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


def _new_id() -> bytes:
    return span_id_bytes(new_span_id())


def delivery_spans(record: Record) -> list[bytes]:
    """The encoded spans of a ``DELIVERY`` record, in the order :class:`.export.Spans` gives."""
    d = DeliveryRecord(*record)
    trace_id, parent_id = wire_context(d.carried)
    process_id = _new_id()
    guard_id = span_id_bytes(d.guard_id) if d.guard_id else (_new_id() if d.guard_start else b"")
    parts = _parts(d.system, d.topic, d.partition, d.lane)
    trace = b"\x0a\x10" + trace_id
    waited_from = min(d.produced, d.entered) if d.produced else d.entered
    out = [
        otlp.joined_span(
            trace,
            _new_id(),
            parent_id or process_id,
            parts.wait,
            waited_from,
            d.entered,
            parts.partition,
        )
    ]
    attributes = _process_attributes(parts, d)
    out.append(
        otlp.joined_span(trace, process_id, parent_id, parts.process, d.entered, d.end, attributes)
    )
    if d.keys is not None and d.admitted:
        throttle = {
            "pipeline.throttle.keys": list(d.keys),
            "pipeline.throttle.priority": d.priority,
        }
        out.append(
            otlp.joined_span(
                trace,
                _new_id(),
                process_id,
                _THROTTLE,
                d.entered,
                max(d.admitted, d.entered),
                otlp.attributes(9, throttle),
            )
        )
    if guard_id:
        out.append(
            otlp.joined_span(
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
            otlp.joined_span(
                trace,
                _new_id(),
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


_NO_TRACE = bytes(16)
_NO_SPAN = bytes(8)


def wire_context(carried: tuple[int, int] | bytes | str | None) -> tuple[bytes, bytes]:
    """:func:`trace_context` as the ids' bytes (no parent: empty), for the wire.

    A well-formed ``traceparent`` as it came (the usual case) is read straight from its hex
    digits; anything else goes through :func:`trace_context`, so both accept the same values.
    """
    if (
        type(carried) is bytes
        and len(carried) == TRACEPARENT_CHARS
        and carried[2] == _DASH
        and carried[35] == _DASH
        and carried[52] == _DASH
        and carried[:2] != b"ff"
    ):
        try:
            trace, parent = _unhex(carried[3:35]), _unhex(carried[36:52])
            _unhex(carried[53:55])  # the flags: parse() takes only hex digits there too
        except binascii.Error:
            pass
        else:
            if trace != _NO_TRACE and parent != _NO_SPAN:
                return trace, parent
    trace_id, parent_id = trace_context(carried)
    return trace_id.to_bytes(16, "big"), span_id_bytes(parent_id) if parent_id else b""


_DASH = ord("-")
_unhex = binascii.unhexlify


def _process_attributes(parts: _Parts, d: DeliveryRecord) -> bytes:
    """The process span's attributes, events and status, in :class:`.export.Spans`' order."""
    attributes = [
        parts.destination,
        otlp.utf8_attribute(_MESSAGE_ID, b"%d-%d" % (d.partition, d.offset)),
        parts.lane,
        _ATTEMPTS[d.attempt],
        _COUNTS[d.delivery_count],
    ]
    if d.tenant:
        attributes.append(otlp.utf8_attribute(_TENANT, utf8(d.tenant)))
    if parts.kafka:
        attributes.append(otlp.int_attribute(_OFFSET, d.offset))
    if d.key is not None:
        attributes.append(otlp.utf8_attribute(KAFKA_KEY, utf8(d.key)))
    attributes.append(_OUTCOMES[d.outcome])
    if d.events:
        attributes.append(otlp.span_events(d.events))
    if d.outcome is None:
        attributes.append(_UNROUTED)
    return b"".join(attributes)


def utf8(raw: bytes) -> bytes:
    """``raw`` as the UTF-8 of its text (undecodable bytes replaced, as the SDK path does)."""
    return raw if raw.isascii() else raw.decode(errors="replace").encode()


def int_or(raw: bytes | None, default: int) -> int:
    """``raw`` (a header's value) as an int, or ``default`` if absent or not a number."""
    try:
        return int(raw) if raw is not None else default
    except ValueError:
        return default
