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
import random
import struct
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from pipeline.tracing import otlp
from pipeline.tracing.record import (
    Record,
    new_span_id,
    new_trace_id,
    parse,
    spliceable,
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


def _tenant(tenant: bytes) -> bytes:
    return otlp.utf8_attribute(_TENANT, utf8(tenant))


_ATTEMPTS: _Kept[bytes | None] = _Kept(_attempt)
_TENANTS: _Kept[bytes] = _Kept(_tenant)
"""Tenants repeat; like the other tables it starts afresh past ``_KEPT_MAX`` values."""
_COUNTS: _Kept[int] = _Kept(_delivery_count)
_OUTCOMES: _Kept[str | None] = _Kept(_outcome)


@dataclass(frozen=True, slots=True)
class _Parts:
    """The encoded parts of the spans of one topic partition's deliveries to one lane."""

    wait: otlp.FixedSpan
    """Partition wait: its name, kind and one attribute, the partition, fixed."""
    process: bytes
    """Process: name and kind."""
    destination: bytes
    """Process: the attributes before the message id (system, operation, topic, partition,
    consumer group)."""
    lane: bytes
    """Process and handler: the ``pipeline.lane`` attribute."""
    handler: otlp.FixedSpan
    """Handler, when it did not fail: name, kind and the lane attribute, fixed."""
    kafka: bool
    """Whether the process span carries the Kafka offset."""


@functools.lru_cache(maxsize=4096)
def _parts(system: str, topic: str, partition: int, lane: str, group: str) -> _Parts:
    partition_id = otlp.attribute("messaging.destination.partition.id", str(partition))
    destination = (
        otlp.attribute("messaging.system", system),
        otlp.attribute("messaging.operation.type", "process"),
        otlp.attribute("messaging.operation.name", "process"),
        otlp.attribute("messaging.destination.name", topic),
        partition_id,
        otlp.attribute("messaging.consumer.group.name", group) if group else b"",
    )
    lane_attribute = otlp.attribute("pipeline.lane", lane)
    return _Parts(
        wait=otlp.fixed_span(otlp.name_and_kind("partition wait", _INTERNAL), partition_id),
        process=otlp.name_and_kind(f"process {topic}", otlp.KIND["consumer"]),
        destination=b"".join(destination),
        lane=lane_attribute,
        handler=otlp.fixed_span(_HANDLER, lane_attribute),
        kafka=system == "kafka",
    )


_GUARD_SPAN = otlp.fixed_span(_GUARD, b"")
"""A guard span without events."""
_getrandbits = random.getrandbits


def _new_ids() -> tuple[bytes, bytes, bytes]:
    """Three random, non-zero span ids (eight bytes each), from one draw."""
    drawn = _getrandbits(192).to_bytes(24, "big")
    ids = drawn[:8], drawn[8:16], drawn[16:]
    if _NO_SPAN in ids:  # one chance in 2**64 each
        return _new_id(), _new_id(), _new_id()
    return ids


def _new_id() -> bytes:
    return span_id_bytes(new_span_id())


def delivery_spans(record: Record) -> list[bytes]:
    """The encoded spans of a ``DELIVERY`` record, in the order :class:`.export.Spans` gives.

    The fields are unpacked in :class:`~.record.DeliveryRecord`'s order (making the named tuple
    would cost more than the wait span's encoding).
    """
    (
        _kind,
        carried,
        produced,
        entered,
        admitted,
        keys,
        priority,
        guard_number,
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
        group,
        attempt,
        delivery_count,
        tenant,
        key,
        outcome,
        events,
        guard_events,
    ) = record
    trace_id, parent_id = wire_context(carried)
    process_id, wait_id, handler_id = _new_ids()
    guard_id = span_id_bytes(guard_number) if guard_number else b""
    if not guard_id and guard_start:  # a guard span whose id the member did not make
        guard_id = _new_id()
    parts = _parts(system, topic, partition, lane, group)
    waited_from = min(produced, entered) if produced else entered
    out = [parts.wait(trace_id, wait_id, parent_id or process_id, waited_from, entered)]
    attributes = _process_attributes(
        parts, partition, offset, attempt, delivery_count, tenant, key, outcome, events
    )
    trace = otlp.TRACE_ID_TAG + trace_id
    out.append(
        otlp.joined_span(trace, process_id, parent_id, parts.process, entered, end, attributes)
    )
    if keys is not None and admitted:
        throttle = {"pipeline.throttle.keys": list(keys), "pipeline.throttle.priority": priority}
        out.append(
            otlp.joined_span(
                trace,
                _new_id(),
                process_id,
                _THROTTLE,
                entered,
                max(admitted, entered),
                otlp.attributes(9, throttle),
            )
        )
    if guard_id:
        if guard_events:
            out.append(
                otlp.joined_span(
                    trace,
                    guard_id,
                    process_id,
                    _GUARD,
                    guard_start,
                    guard_end or end,
                    otlp.span_events(guard_events),
                )
            )
        else:
            out.append(_GUARD_SPAN(trace_id, guard_id, process_id, guard_start, guard_end or end))
    if handler_start:
        handler_parent = guard_id or process_id
        if failure:
            tail = parts.lane + otlp.span_events([failure[1]]) + otlp.status(failure[0])
            out.append(
                otlp.joined_span(
                    trace, handler_id, handler_parent, _HANDLER, handler_start, handler_end, tail
                )
            )
        else:
            out.append(
                parts.handler(trace_id, handler_id, handler_parent, handler_start, handler_end)
            )
    return out


def trace_context(carried: tuple[int, int] | bytes | str | None) -> tuple[int, int]:
    """A delivery's trace id and parent span id: parsed already, from its traceparent, or new."""
    if isinstance(carried, tuple):
        return carried
    parsed = parse(carried)
    return (parsed[0], parsed[1]) if parsed else (new_trace_id(), 0)


_NO_SPAN = bytes(8)


def wire_context(carried: tuple[int, int] | bytes | str | None) -> tuple[bytes, bytes]:
    """:func:`trace_context` as the ids' bytes (no parent: empty), for the wire.

    A ``traceparent`` as this pipeline writes them (the usual case, :func:`.record.spliceable`)
    is read straight from its hex digits; anything else goes through :func:`trace_context`, so
    both accept the same values.
    """
    if spliceable(carried):  # version 00 in lower-case hex, ids not zero: what parse() takes
        return _unhex(carried[3:35]), _unhex(carried[36:52])
    trace_id, parent_id = trace_context(carried)
    return trace_id.to_bytes(16, "big"), span_id_bytes(parent_id) if parent_id else b""


_unhex = binascii.unhexlify


def _process_attributes(
    parts: _Parts,
    partition: int,
    offset: int,
    attempt: bytes | None,
    delivery_count: int,
    tenant: bytes | None,
    key: bytes | None,
    outcome: str | None,
    events: list[tuple[str, int, dict[str, Any] | None]] | None,
) -> bytes:
    """The process span's attributes, events and status, in :class:`.export.Spans`' order."""
    tail = _OUTCOMES[outcome]
    if events:
        tail += otlp.span_events(events)
    if outcome is None:
        tail += _UNROUTED
    return b"".join(
        (
            parts.destination,
            otlp.utf8_attribute(_MESSAGE_ID, b"%d-%d" % (partition, offset)),
            parts.lane,
            _ATTEMPTS[attempt],
            _COUNTS[delivery_count],
            _TENANTS[tenant] if tenant else b"",
            otlp.int_attribute(_OFFSET, offset) if parts.kafka else b"",
            b"" if key is None else otlp.utf8_attribute(KAFKA_KEY, utf8(key)),
            tail,
        )
    )


def utf8(raw: bytes) -> bytes:
    """``raw`` as the UTF-8 of its text (undecodable bytes replaced, as the SDK path does)."""
    return raw if raw.isascii() else raw.decode(errors="replace").encode()


_INT64 = range(-(1 << 63), 1 << 63)
"""What an OTLP int attribute holds: a value beyond it is no varint the collector reads."""


def int_or(raw: bytes | None, default: int) -> int:
    """``raw`` (a header's value) as an int, or ``default`` if absent, not a number or no int64."""
    try:
        value = int(raw) if raw is not None else default
    except ValueError:
        return default
    return value if value in _INT64 else default
