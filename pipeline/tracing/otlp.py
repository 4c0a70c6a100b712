"""OTLP protobuf for the exporting process: an ``ExportTraceServiceRequest`` written field by field.

Building the SDK's ``ReadableSpan`` objects and encoding them with its encoder costs tens of
microseconds a span (most of it creating one protobuf object per attribute), more than the
member spends on a message; writing the wire format directly from :mod:`.record`'s tuples
costs a fraction of that. Field numbers are those of ``opentelemetry/proto/trace/v1/
trace.proto``, ``common.proto`` and ``resource.proto``; the tests decode the result with
``opentelemetry-proto``.

String attribute values are cut as the SDK cuts them: a span's to
``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` characters (else ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``),
an event's to ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``; unset, they are not cut.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeAlias

_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_FIXED32 = struct.Struct("<I")

KIND = {"internal": 1, "server": 2, "client": 3, "producer": 4, "consumer": 5}
STATUS_ERROR = 2
SAMPLED_FLAGS = 0x1
"""``Span.flags``: the W3C trace flags (sampled); whether the parent is remote is left unsaid."""


def _chars_max(*names: str) -> int | None:
    """The first of the ``names`` set to a whole number (the SDK refused other values first)."""
    for name in names:
        raw = os.environ.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return None


EVENT_VALUE_CHARS_MAX = _chars_max("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")
"""The longest string value of an event's attribute (None: no limit)."""
SPAN_VALUE_CHARS_MAX = _chars_max(
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"
)
"""The longest string value of a span's attribute (None: no limit)."""


def _cut(value: Any, chars_max: int | None) -> Any:
    """``value`` with its strings (its items' too) cut to ``chars_max`` characters."""
    if chars_max is None:
        return value
    if isinstance(value, str):
        return value[:chars_max] if len(value) > chars_max else value
    if isinstance(value, (list, tuple)):
        return [_cut(item, chars_max) for item in value]
    return value


_MORE = 0x80
"""A varint byte's high bit: more bytes follow."""


_SMALL = [bytes((i,)) for i in range(_MORE)]
_TWO_BYTES = 1 << 14
"""Values below this are two varint bytes (or one)."""
_FOUR_BYTES = 1 << 28
"""Values below this are at most four varint bytes (a Kafka offset, most often)."""


def varint(value: int) -> bytes:
    """``value`` (unsigned, or a negative int64 as its two's complement) as a varint."""
    if 0 <= value < _MORE:
        return _SMALL[value]
    if value < 0:
        value += 1 << 64
    if value < _TWO_BYTES:
        return bytes(((value & 0x7F) | _MORE, value >> 7))
    if value < _FOUR_BYTES:
        if value < 1 << 21:
            return bytes(((value & 0x7F) | _MORE, (value >> 7 & 0x7F) | _MORE, value >> 14))
        return bytes(
            (
                (value & 0x7F) | _MORE,
                (value >> 7 & 0x7F) | _MORE,
                (value >> 14 & 0x7F) | _MORE,
                value >> 21,
            )
        )
    out = bytearray()
    while value >= _MORE:
        out.append((value & 0x7F) | _MORE)
        value >>= 7
    out.append(value)
    return bytes(out)


_TAGS = [_SMALL[field << 3 | 2] for field in range(16)]


def _len(field: int, payload: bytes) -> bytes:
    """A length-delimited field (``field`` < 16)."""
    size = len(payload)
    return _TAGS[field] + (_SMALL[size] if size < _MORE else varint(size)) + payload


@functools.lru_cache(maxsize=4096)
def _str(field: int, value: str) -> bytes:
    """A string field; names, keys and most values repeat, so they are kept encoded.

    A lone surrogate (text read with ``surrogateescape``) is no UTF-8: it becomes ``?``.
    """
    return _len(field, value.encode(errors="replace"))


@functools.lru_cache(maxsize=16384, typed=True)  # True and 1 are equal keys otherwise
def _key_value(key: str, value: str | float) -> bytes:
    return _str(1, key) + _len(2, any_value(value))


def any_value(value: Any) -> bytes:  # noqa: PLR0911 - one return per AnyValue case
    """An ``AnyValue``: str, bool, int, float, or a sequence of those."""
    if isinstance(value, str):
        return _str(1, value)
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _len(7, value)
    if isinstance(value, (list, tuple)):
        return _len(5, b"".join(_len(1, any_value(item)) for item in value))
    return _str(1, str(value))


def attributes(field: int, values: Mapping[str, Any] | None) -> bytes:
    """Repeated ``KeyValue`` under ``field`` (a span's 9 and an event's 3 with values cut)."""
    if not values:
        return b""
    chars_max = _VALUE_CHARS_MAX.get(field)
    if chars_max is not None:
        values = {key: _cut(value, chars_max) for key, value in values.items()}
    return b"".join(
        _len(field, _key_value(key, value) if type(value) in _SCALAR else _kv(key, value))
        for key, value in values.items()
    )


_SCALAR = frozenset({str, int, bool, float})
_VALUE_CHARS_MAX = {9: SPAN_VALUE_CHARS_MAX, 3: EVENT_VALUE_CHARS_MAX}
"""The limit of each attributes field: a span's, an event's (a resource's is not cut)."""


def _kv(key: str, value: Any) -> bytes:
    return _str(1, key) + _len(2, any_value(value))


TRACE_ID_TAG = b"\x0a\x10"
"""A ``Span``'s trace id field (1, 16 bytes), before its bytes."""
_SPAN_TAG = b"\x12\x08"
_PARENT_TAG = b"\x22\x08"
_START_TAG = 0x39
_END_TAG = 0x41


def span(
    trace_id: bytes,
    span_id: int,
    parent_id: int,
    name: str,
    kind: int,
    start_ns: int,
    end_ns: int,
    attrs: Mapping[str, Any] | None,
    events: Iterable[tuple[str, int, Mapping[str, Any] | None]] | None = None,
    links: Iterable[tuple[int, int]] | None = None,
    error: str | None = None,
) -> bytes:
    """One ``Span``, as the ``spans`` field of a ``ScopeSpans`` (``trace_id`` as its 16 bytes)."""
    out = [
        TRACE_ID_TAG,
        trace_id,
        _SPAN_TAG,
        span_id.to_bytes(8, "big"),
    ]
    if parent_id:
        out += (_PARENT_TAG, parent_id.to_bytes(8, "big"))
    out += (
        name_and_kind(name, kind),
        TIMES.pack(_START_TAG, start_ns, _END_TAG, end_ns),
        attributes(9, attrs),
        span_events(events),
    )
    for link_trace, link_span in links or ():
        body = TRACE_ID_TAG + link_trace.to_bytes(16, "big") + _SPAN_TAG
        out.append(_len(13, body + link_span.to_bytes(8, "big")))
    out += (status(error), FLAGS)
    return spans_field(b"".join(out))


TIMES = struct.Struct("<BQBQ")
"""A span's start and end (fields 7 and 8, fixed64), packed as ``(0x39, start, 0x41, end)``."""
FLAGS = b"\x85\x01" + _FIXED32.pack(SAMPLED_FLAGS)
"""A span's last field, its flags (16, fixed32)."""


def joined_span(
    trace: bytes,
    span_id: bytes,
    parent_id: bytes,
    name_kind: bytes,
    start: int,
    end: int,
    tail: bytes = b"",
) -> bytes:
    """One span from parts already encoded, as the ``spans`` field of a ``ScopeSpans``.

    The bytes :func:`span` writes, for spans whose name, kind and attributes repeat
    (:mod:`.wire_delivery`, :mod:`.wire_ingress`): ``trace`` is the trace id field
    (tag, length and the 16 bytes), ``span_id`` and ``parent_id`` the ids' eight bytes
    (no parent: empty), ``name_kind`` from :func:`name_and_kind`, ``tail`` the attributes,
    events and status, encoded.
    """
    parent = _PARENT_TAG + parent_id if parent_id else b""
    size = len(trace) + len(parent) + len(name_kind) + len(tail) + _JOINED_FIXED
    return b"".join(
        (
            b"\x12" + varint(size),
            trace,
            _SPAN_TAG,
            span_id,
            parent,
            name_kind,
            TIMES.pack(_START_TAG, start, _END_TAG, end),
            tail,
            FLAGS,
        )
    )


_JOINED_FIXED = 2 + 8 + TIMES.size + len(FLAGS)
"""The bytes of a joined span but its trace id, parent, name, kind and tail."""

FixedSpan: TypeAlias = Callable[[bytes, bytes, bytes, int, int], bytes]
"""``(trace id, span id, parent id, start, end)`` to the span, as :func:`fixed_span` makes it."""


def fixed_span(name_kind: bytes, tail: bytes) -> FixedSpan:
    """The writer of spans that have a parent and whose name, kind and tail never change.

    The span :func:`joined_span` writes, in one ``struct.pack``: only its trace id (the 16
    bytes), its span and parent ids (eight bytes each) and its times change, and none of them
    changes the span's length, so the length and every tag are laid out once, here.
    """
    size = len(TRACE_ID_TAG) + 16 + len(_PARENT_TAG) + 8 + len(name_kind) + len(tail)
    head = b"\x12" + varint(size + _JOINED_FIXED) + TRACE_ID_TAG
    end = tail + FLAGS
    pack = struct.Struct(f"<{len(head)}s16s2s8s2s8s{len(name_kind)}sBQBQ{len(end)}s").pack

    def span(trace_id: bytes, span_id: bytes, parent_id: bytes, start: int, stop: int) -> bytes:
        return pack(
            head,
            trace_id,
            _SPAN_TAG,
            span_id,
            _PARENT_TAG,
            parent_id,
            name_kind,
            _START_TAG,
            start,
            _END_TAG,
            stop,
            end,
        )

    return span


@functools.lru_cache(maxsize=1024)
def name_and_kind(name: str, kind: int) -> bytes:
    """A span's name (field 5) and kind (6)."""
    return _str(5, name) + b"\x30" + varint(kind)


def span_events(events: Iterable[tuple[str, int, Mapping[str, Any] | None]] | None) -> bytes:
    """A span's events (field 11): name, time and attributes of each."""
    if not events:
        return b""
    return b"".join(
        _len(11, b"\x09" + _FIXED64.pack(at_ns) + _str(2, event_name) + attributes(3, attrs))
        for event_name, at_ns, attrs in events
    )


def status(error: str | None) -> bytes:
    """A span's status (field 15): an error with its message, or nothing (unset)."""
    if error is None:
        return b""
    return _len(15, _str(2, error) + b"\x18" + varint(STATUS_ERROR))


def spans_field(body: bytes) -> bytes:
    """A ``Span`` message's ``body`` as the ``spans`` field (2) of a ``ScopeSpans``."""
    return _len(2, body)


@functools.lru_cache(maxsize=4096)
def attribute_key(key: str) -> bytes:
    """A ``KeyValue``'s key (field 1), kept encoded for :func:`string_attribute` and kin."""
    return _str(1, key)


def string_attribute(key: bytes, value: str) -> bytes:
    """A span attribute (field 9) whose value is a string seen once: not kept in a cache.

    ``key`` from :func:`attribute_key`.
    """
    return utf8_attribute(key, value.encode(errors="replace"))


def utf8_attribute(key: bytes, value: bytes) -> bytes:
    """:func:`string_attribute` of a string given as its UTF-8 bytes."""
    if SPAN_VALUE_CHARS_MAX is not None and len(value) > SPAN_VALUE_CHARS_MAX:
        value = value.decode(errors="replace")[:SPAN_VALUE_CHARS_MAX].encode(errors="replace")
    size = len(value)
    total = len(key) + size + 4
    if total < _MORE:  # every length fits one byte: one format
        return b"\x4a%c%b\x12%c\x0a%c%b" % (total, key, size + 2, size, value)
    return _attribute(key, _len(1, value))


def int_attribute(key: bytes, value: int) -> bytes:
    """A span attribute (field 9) whose value is an int seen once (``key`` as above)."""
    number = varint(value)
    size = len(number) + 1
    total = len(key) + size + 2
    if total < _MORE:
        return b"\x4a%c%b\x12%c\x18%b" % (total, key, size, number)
    return _attribute(key, b"\x18" + number)


def _attribute(key: bytes, any_value_body: bytes) -> bytes:
    size = len(any_value_body)
    total = len(key) + size + 2
    if total < _MORE:  # both lengths fit one byte: one format instead of two fields
        return b"\x4a%c%b\x12%c%b" % (total, key, size, any_value_body)
    return _len(9, key + _len(2, any_value_body))


@functools.lru_cache(maxsize=16384, typed=True)
def attribute(key: str, value: str | float) -> bytes:
    """A span attribute (field 9) with a scalar value that repeats, kept encoded."""
    return _len(9, _key_value(key, _cut(value, SPAN_VALUE_CHARS_MAX)))


def request(resource: Mapping[str, Any], scope: str, spans: Sequence[bytes]) -> bytes:
    """An ``ExportTraceServiceRequest``: one resource, one scope, ``spans`` (from :func:`span`)."""
    scope_spans = _len(1, _str(1, scope)) + b"".join(spans)
    resource_spans = _len(1, attributes(1, resource)) + _len(2, scope_spans)
    return _len(1, resource_spans)
