"""Recording spans cheaply: plain objects and one tuple per finished span or delivery.

The OpenTelemetry SDK's own spans cost tens of microseconds each to start and end and as much
again to encode, in the process that makes them; a delivery has five (partition wait, process,
throttle wait, guard, handler), more than a no-op delivery's whole work. So the hot path records
only what the spans need: a single :class:`Delivery` for the five spans of one delivery, a
:class:`Webhook` for a request's span and its stages, :class:`Sends` for a batch of produced
records, a :class:`Span` for the rest (a turn, a routed send), and hands tuples to the
:class:`Buffer`.
Another process (:mod:`pipeline.tracing.export`) turns those tuples into the SDK's spans, with
their ``messaging.*`` attributes, and exports them with the SDK's OTLP exporter.

The sampling decision is the configured sampler's, made once where a trace enters the process
(a remote ``traceparent`` or none); spans under it inherit it, as the parent-based samplers do.
"""

from __future__ import annotations

import random
import re
import threading
import time
import traceback
from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, NamedTuple, Self, TypeGuard

from pipeline.headers import ATTEMPT, TENANT, retry_tier
from pipeline.log_repeats import error_text

if TYPE_CHECKING:
    from pipeline.envelope import Message

SPAN = "s"
DELIVERY = "d"
WEBHOOK = "w"
SEND = "p"
SERVER, CLIENT, PRODUCER, CONSUMER, INTERNAL = (
    "server",
    "client",
    "producer",
    "consumer",
    "internal",
)
TRACEPARENT_CHARS = 55

Record = tuple[Any, ...]
"""One finished span (``SPAN``), delivery (``DELIVERY``), webhook (``WEBHOOK``) or produce
(``SEND``), as :mod:`.export` reads it."""

Events = list[tuple[str, int, dict[str, Any] | None]]
"""A span's events: name, Unix ns, attributes."""


class DeliveryRecord(NamedTuple):
    """The fields of a ``DELIVERY`` record, in order (:meth:`Delivery.end` writes them).

    Times are Unix nanoseconds (0: the stage did not happen); the traced process sends a plain
    tuple (it is marshalled), the exporting process reads it as this.
    """

    kind: str
    carried: tuple[int, int] | bytes | str | None
    """(trace id, parent span id) if parsed here, else the ``traceparent`` as it came."""
    produced: int
    entered: int
    admitted: int
    keys: tuple[str, ...] | list[str] | None
    priority: int
    guard_id: int
    guard_start: int
    guard_end: int
    handler_start: int
    handler_end: int
    failure: tuple[str, tuple[str, int, dict[str, Any] | None]] | None
    """(error text, its exception event) if the handler raised."""
    end: int
    system: str
    topic: str
    partition: int
    offset: int
    lane: str
    group: str
    """The consumer group (``messaging.consumer.group.name``); empty: none named."""
    attempt: bytes | None
    delivery_count: int
    tenant: bytes | None
    key: bytes | None
    outcome: str | None
    events: list[tuple[str, int, dict[str, Any] | None]] | None
    guard_events: list[tuple[str, int, dict[str, Any] | None]] | None


class WebhookRecord(NamedTuple):
    """The fields of a ``WEBHOOK`` record, in order (:meth:`Webhook.end` writes them).

    The SERVER span of one request and its stages, whose span ids the exporting process makes.
    """

    kind: str
    trace_id: int
    span_id: int
    parent_id: int
    source: str
    start: int
    end: int
    attributes: dict[str, Any] | None
    """Attributes set on the request's span besides those the exporter derives from ``source``."""
    events: Events | None
    error: str | None
    stages: list[tuple[str, int, int, str | None, Events | None]]
    """Each stage (``verify``, ``log commit``): name, start, end, error text, events."""


class SendRecord(NamedTuple):
    """The fields of a ``SEND`` record (:meth:`Sends.end` writes one per produced record)."""

    kind: str
    carried: tuple[int, int] | bytes
    """(trace id, parent span id or 0), or the parent's ``traceparent`` as the record carried
    it (well formed, lower-case hex: :func:`spliceable`), read in the exporting process."""
    span_id: int
    system: str
    topic: str
    key: bytes | None
    start: int
    end: int
    error: str | None
    events: Events | None


_getrandbits = random.getrandbits


def new_span_id() -> int:
    """A random, non-zero 64-bit span id."""
    return _getrandbits(64) or 1


def new_trace_id() -> int:
    """A random, non-zero 128-bit trace id."""
    return _getrandbits(128) or 1


_HEX = b"0123456789abcdef"


def parse(raw: bytes | str | None) -> tuple[int, int, bool] | None:
    """(trace id, span id, sampled) of a W3C ``traceparent`` value, or None if it is not one.

    As the W3C rules have it: lower-case hex only, version ``ff`` refused, version ``00``
    exactly 55 characters; a later version is read by version 00's fields, and what follows
    them must start with a dash.
    """
    if not raw or len(raw) < TRACEPARENT_CHARS:
        return None
    value = raw if isinstance(raw, bytes) else raw.encode("latin-1", "replace")
    if len(value) != TRACEPARENT_CHARS:
        if value[:2] == b"00" or value[55:56] != b"-":
            return None
        value = value[:TRACEPARENT_CHARS]
    if value[2:3] != b"-" or value[35:36] != b"-" or value[52:53] != b"-" or value[:2] == b"ff":
        return None
    ids, flags = value[3:35] + value[36:52], value[53:]
    if (value[:2] + ids + flags).translate(None, _HEX):
        return None  # upper case, or not hex at all ("_", "+", spaces, other letters)
    trace_id, span_id, sampled = int(ids[:32], 16), int(ids[32:], 16), int(flags, 16) & 1
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(sampled)


TRACESTATE_CHARS_MAX = 512
"""The longest ``tracestate`` carried: what the W3C rules ask every participant to propagate."""
TRACESTATE_MEMBERS_MAX = 32
_TRACESTATE_MEMBER = re.compile(
    r"(?:[a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)


def tracestate(raw: str | None) -> str | None:
    """A W3C ``tracestate`` value to carry on, or None if ``raw`` is none or not one.

    Its list members (``key=value``, at most 32, keys unique, in the W3C grammar) joined by
    ``,`` without the optional spaces and empty members; a value over 512 characters, or one
    that does not follow the grammar, is discarded whole, as the W3C rules allow.
    """
    if not raw or len(raw) > TRACESTATE_CHARS_MAX:
        return None
    members = [member for part in raw.split(",") if (member := part.strip(" \t"))]
    if not members or len(members) > TRACESTATE_MEMBERS_MAX:
        return None
    if not all(_TRACESTATE_MEMBER.fullmatch(member) for member in members):
        return None
    if len({member.split("=", 1)[0] for member in members}) != len(members):
        return None
    return ",".join(members)


def traceparent(trace_id: int, span_id: int, *, sampled: bool) -> str:
    """The W3C ``traceparent`` value naming one span."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


_HEX_AND_DASH = _HEX + b"-"
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16
_DASHES = 3


def spliceable(raw: object) -> TypeGuard[bytes]:
    """Whether ``raw`` is a ``traceparent`` as :func:`traceparent` writes them (lower-case hex).

    Such a value names the same ids :func:`parse` reads from it, so a child's value can be made
    by putting the child's span id in its place (``raw[:36] + span + flags``) without parsing
    and formatting the trace id. Anything else (upper case, another version, a malformed value)
    is for :func:`parse`.
    """
    return (
        type(raw) is bytes
        and len(raw) == TRACEPARENT_CHARS
        and raw[:3] == b"00-"
        and raw[35:36] == b"-"
        and raw[52:53] == b"-"
        and raw.count(b"-") == _DASHES
        and not raw.translate(None, _HEX_AND_DASH)
        and raw[3:35] != _ZERO_TRACE
        and raw[36:52] != _ZERO_SPAN
    )


def send_attributes(system: str, topic: str, key: bytes | None) -> dict[str, Any]:
    """The ``messaging.*`` attributes of a PRODUCER span sending ``key`` to ``topic``."""
    attributes: dict[str, Any] = {
        "messaging.system": system,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": topic,
    }
    if key is not None:
        attributes["messaging.kafka.message.key"] = key.decode(errors="replace")
    return attributes


def exception_event(error: BaseException, at_ns: int) -> tuple[str, int, dict[str, str]]:
    """The ``exception`` event of the OpenTelemetry conventions for ``error``."""
    return (
        "exception",
        at_ns,
        {
            "exception.type": type(error).__qualname__,
            "exception.message": error_text(error),  # the app's __str__ may raise
            "exception.stacktrace": "".join(traceback.format_exception(error)),
        },
    )


class Buffer:
    """Finished records waiting for the exporting process, bounded like the SDK's batch queue.

    ``wake`` is called once the buffer holds ``batch`` records, so a full batch leaves early;
    past ``limit`` records new ones are dropped (and counted), never waited for.
    """

    __slots__ = ("batch", "dropped", "items", "limit", "lock", "wake")

    def __init__(self, limit: int, batch: int, wake: Callable[[], None]) -> None:
        """An empty buffer."""
        self.items: list[Record] = []
        self.limit = limit
        self.batch = batch
        self.wake = wake
        self.dropped = 0
        self.lock = threading.Lock()

    def add(self, record: Record) -> None:
        """Keep ``record`` for the next export (dropped if the buffer is full)."""
        items = self.items
        size = len(items)
        if size >= self.limit:
            self.dropped += 1
            return
        items.append(record)
        if size + 1 == self.batch:
            self.wake()

    def take(self) -> list[Record]:
        """Everything kept so far, leaving the buffer empty."""
        with self.lock:
            items, self.items = self.items, []
        return items


class Sampler:
    """The configured sampler's decision where a trace enters this process.

    ``follow``: a remote parent's sampled flag decides (the parent-based samplers). Otherwise,
    and for new traces, ``decide(trace_id, name)`` does; ``always`` short-cuts the
    always-on and always-off samplers.
    """

    __slots__ = ("always", "decide", "follow")

    def __init__(
        self, decide: Callable[[int, str], bool], *, follow: bool, always: bool | None = None
    ) -> None:
        """A decision for entering traces."""
        self.decide = decide
        self.follow = follow
        self.always = always

    def sampled(self, trace_id: int, name: str, remote: bool | None) -> bool:
        """Whether a trace entering here is recorded; ``remote``: the carried flag, if any."""
        if remote is not None and self.follow:
            return remote
        if self.always is not None:
            return self.always
        return self.decide(trace_id, name)


class _Recording:
    """What a recorded span (:class:`Span`, :class:`Webhook`) does inside its ``with``.

    It is the current span (:data:`CURRENT`), takes attributes and events, fails with an
    escaping error, and ends at the end.
    """

    __slots__ = ("attributes", "error", "events", "token")
    attributes: dict[str, Any] | None
    events: Events | None
    error: str | None
    token: Token[Span | Delivery | Webhook | None] | None
    end: Callable[[], None]
    """Ends the span now and buffers it (each kind its own)."""

    def __enter__(self) -> Self:
        """The current span inside (:data:`CURRENT`)."""
        self.token = CURRENT.set(self)  # type: ignore[arg-type] # Span or Webhook
        return self

    def __exit__(self, kind: object, error: BaseException | None, _tb: object) -> None:
        """No longer current; ended, and failed if ``error`` escaped."""
        if error is not None:
            self.fail(error)
        if self.token is not None:
            CURRENT.reset(self.token)
        self.end()

    def set_attribute(self, key: str, value: Any) -> None:
        """Set one attribute."""
        if self.attributes is None:
            self.attributes = {}
        self.attributes[key] = value

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        """Add an event, timed now."""
        if self.events is None:
            self.events = []
        self.events.append((name, time.time_ns(), attributes))

    def fail(self, error: BaseException) -> None:
        """Mark the span failed by ``error`` (status ERROR and an ``exception`` event)."""
        if self.events is None:
            self.events = []
        self.events.append(exception_event(error, time.time_ns()))
        self.error = type(error).__name__


class Span(_Recording):
    """One span being recorded: ids, times, attributes, events; a tuple once ended.

    A span of an unsampled trace (``sampled`` False) is never buffered: it exists to carry
    its ids and the "not sampled" flag to what it produces.
    """

    __slots__ = (
        "buffer",
        "kind",
        "links",
        "name",
        "parent_id",
        "sampled",
        "span_id",
        "start_ns",
        "trace_id",
        "tracestate",
    )

    def __init__(
        self,
        buffer: Buffer,
        name: str,
        trace_id: int,
        parent_id: int,
        sampled: bool,
        *,
        kind: str = INTERNAL,
        start_ns: int = 0,
        attributes: dict[str, Any] | None = None,
        links: list[tuple[int, int]] | None = None,
    ) -> None:
        """Start the span (now, unless ``start_ns`` is given)."""
        self.buffer = buffer
        self.name = name
        self.trace_id = trace_id
        self.span_id = new_span_id()
        self.parent_id = parent_id
        self.sampled = sampled
        self.kind = kind
        self.start_ns = start_ns or time.time_ns()
        self.attributes = attributes
        self.links = links
        self.events: list[tuple[str, int, dict[str, Any] | None]] | None = None
        self.error: str | None = None
        self.token: Token[Span | Delivery | Webhook | None] | None = None
        self.tracestate: str | None = None
        """The ``tracestate`` that came with the context it continues (a request's)."""

    def traceparent(self) -> str:
        """This span's context as a ``traceparent`` value."""
        return traceparent(self.trace_id, self.span_id, sampled=self.sampled)

    def end(self, end_ns: int = 0) -> None:
        """End the span (now, unless ``end_ns`` is given) and buffer it if sampled."""
        if self.sampled:
            self.buffer.add(
                (
                    SPAN,
                    self.trace_id,
                    self.span_id,
                    self.parent_id,
                    self.name,
                    self.kind,
                    self.start_ns,
                    end_ns or time.time_ns(),
                    self.attributes,
                    self.events,
                    self.links,
                    self.error,
                )
            )


class Delivery:
    """The spans of one delivery, kept as fields and buffered as one flat tuple by :meth:`end`.

    ``process`` (CONSUMER) with its ``partition wait`` before it, and under it ``throttle
    wait``, ``guard`` and the guard's ``handler``. While the guard runs the delivery is the
    current span (:data:`CURRENT`) as its guard span, so what the guard routes and the
    lifecycle events it records go under the guard. The attributes are built by the exporting
    process from the message's fields, which :meth:`end` copies into the record.

    Every delivery makes one of these and one record tuple, nothing more: the garbage
    collector's young-generation passes run on allocations, and each extra tuple per message
    (a fields tuple, a handler tuple, a wrapping coroutine) made them run more often.
    """

    __slots__ = (
        "_guard_id",
        "_ids",
        "admitted_ns",
        "buffer",
        "entered_ns",
        "events",
        "failure",
        "group",
        "guard_end_ns",
        "guard_events",
        "guard_start_ns",
        "handler_end_ns",
        "handler_start_ns",
        "keys",
        "lane",
        "message",
        "priority",
        "raw",
        "system",
    )

    sampled = True

    def __init__(
        self,
        buffer: Buffer,
        raw: bytes | None,
        ids: tuple[int, int] | None,
        message: Message,
        lane: str,
        system: str,
        group: str = "",
    ) -> None:
        """Start the ``process`` span now, under the ``traceparent`` ``raw`` (None: a new trace).

        ``ids``: (trace id, parent span id) when the caller parsed ``raw`` already; otherwise
        they are parsed only if a child span or a log line needs them, and else by the
        exporting process. ``message``, ``lane`` and ``system`` name what is processed,
        ``group`` the consumer group processing it.
        """
        self.buffer = buffer
        self.raw = raw
        self._ids = ids
        self._guard_id = 0
        self.message = message
        self.lane = lane
        self.system = system
        self.group = group
        self.entered_ns = time.time_ns()
        self.admitted_ns = self.guard_start_ns = self.guard_end_ns = 0
        self.handler_start_ns = self.handler_end_ns = 0
        self.failure: tuple[str, tuple[Any, ...]] | None = None
        self.keys: tuple[str, ...] | None = None
        self.priority = 0
        self.events: list[tuple[str, int, dict[str, Any] | None]] | None = None
        self.guard_events: list[tuple[str, int, dict[str, Any] | None]] | None = None

    def ids(self) -> tuple[int, int]:
        """(trace id, parent span id), parsed from the ``traceparent`` the first time."""
        if self._ids is None:
            carried = parse(self.raw)
            self._ids = (carried[0], carried[1]) if carried else (new_trace_id(), 0)
        return self._ids

    @property
    def trace_id(self) -> int:
        """The delivery's trace."""
        return self.ids()[0]

    @property
    def span_id(self) -> int:
        """The guard span's id (what runs under the guard is its child), made when first asked."""
        if not self._guard_id:
            self._guard_id = new_span_id()
        return self._guard_id

    def traceparent(self) -> str:
        """The guard span's context (what the guard routes is its child)."""
        return traceparent(self.trace_id, self.span_id, sampled=True)

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        """A lifecycle event on the guard span (while it runs)."""
        if self.guard_events is None:
            self.guard_events = []
        self.guard_events.append((name, time.time_ns(), attributes))

    def set_attribute(self, key: str, value: Any) -> None:
        """Attributes of the guard span are not kept (none are set there)."""

    def end(self, outcome: str | None, lifecycle: bool) -> None:
        """End the ``process`` span with ``outcome`` and buffer the whole delivery."""
        now = time.time_ns()
        if lifecycle and outcome is not None:
            if self.events is None:
                self.events = []
            self.events.append((outcome, now, None))
        message = self.message
        headers = message.headers
        stamp = message.timestamp_ms
        self.buffer.add(
            (
                DELIVERY,
                self._ids if self._ids is not None else self.raw,
                stamp * 1_000_000 if stamp else 0,
                self.entered_ns,
                self.admitted_ns,
                self.keys,
                self.priority,
                self._guard_id,
                self.guard_start_ns,
                self.guard_end_ns,
                self.handler_start_ns,
                self.handler_end_ns,
                self.failure,
                now,
                self.system,
                message.topic,
                message.partition,
                message.offset,
                self.lane,
                self.group,
                headers.get(ATTEMPT) if retry_tier(message.topic) else None,  # 1 on a main topic
                message.delivery_count,
                headers.get(TENANT),
                message.key,
                outcome,
                self.events,
                self.guard_events,
            )
        )


class Webhook(_Recording):
    """The SERVER span of one webhook request and its stages, buffered as one tuple by :meth:`end`.

    The request's span is current (:data:`CURRENT`) inside its ``with``; a stage
    (:class:`Stage`) only notes its times, so a request makes this object, one small object per
    stage and one record, where separate spans made three of each and set the context var three
    times. The exporting process gives the stages their span ids and the request's span its
    ``http.*`` and ``pipeline.source`` attributes (:class:`WebhookRecord`).
    """

    __slots__ = (
        "buffer",
        "parent_id",
        "source",
        "span_id",
        "stages",
        "start_ns",
        "trace_id",
        "tracestate",
    )

    sampled = True

    def __init__(
        self,
        buffer: Buffer,
        source: str,
        trace_id: int,
        parent_id: int,
        tracestate: str | None = None,
    ) -> None:
        """Start the request's span now, in trace ``trace_id`` under ``parent_id`` (0: a root).

        ``tracestate``: the provider's, carried on with the request's context.
        """
        self.buffer = buffer
        self.source = source
        self.trace_id = trace_id
        self.span_id = new_span_id()
        self.parent_id = parent_id
        self.start_ns = time.time_ns()
        self.attributes: dict[str, Any] | None = None
        self.events: Events | None = None
        self.error: str | None = None
        self.stages: list[tuple[str, int, int, str | None, Events | None]] = []
        self.token: Token[Span | Delivery | Webhook | None] | None = None
        self.tracestate = tracestate

    def traceparent(self) -> str:
        """The request span's context as a ``traceparent`` value."""
        return traceparent(self.trace_id, self.span_id, sampled=True)

    def end(self) -> None:
        """End the request's span now and buffer it with its stages."""
        self.buffer.add(
            (
                WEBHOOK,
                self.trace_id,
                self.span_id,
                self.parent_id,
                self.source,
                self.start_ns,
                time.time_ns(),
                self.attributes,
                self.events,
                self.error,
                self.stages,
            )
        )


class Stage:
    """One stage of a :class:`Webhook` (an INTERNAL child span), noted when its ``with`` ends."""

    __slots__ = ("name", "owner", "start_ns")

    def __init__(self, owner: Webhook, name: str) -> None:
        """A stage of ``owner`` named ``name``, started by ``with``."""
        self.owner = owner
        self.name = name
        self.start_ns = 0

    def __enter__(self) -> Self:
        """Start the stage now."""
        self.start_ns = time.time_ns()
        return self

    def __exit__(self, kind: object, error: BaseException | None, _tb: object) -> None:
        """End the stage now, failed if ``error`` escaped."""
        end = time.time_ns()
        if error is None:
            self.owner.stages.append((self.name, self.start_ns, end, None, None))
        else:
            failure: Events = [exception_event(error, end)]
            self.owner.stages.append((self.name, self.start_ns, end, type(error).__name__, failure))


class Sends:
    """The PRODUCER spans of one batch of produced records, one ``SEND`` record each at the end.

    ``items`` holds (parent context, span id, key) per sampled record, the context as
    :attr:`SendRecord.carried` has it; the exporting process builds the ``messaging.*``
    attributes (:class:`SendRecord`).
    """

    __slots__ = ("buffer", "items", "start_ns", "system", "topic")

    def __init__(self, buffer: Buffer, system: str, topic: str) -> None:
        """Sends to ``topic`` over ``system``, started now."""
        self.buffer = buffer
        self.system = system
        self.topic = topic
        self.start_ns = time.time_ns()
        self.items: list[tuple[tuple[int, int] | bytes, int, bytes | None]] = []

    def end(self, error: BaseException | None = None) -> None:
        """End every send now (failed by ``error`` if given) and buffer them."""
        now = time.time_ns()
        text = None if error is None else type(error).__name__
        events: Events | None = None if error is None else [exception_event(error, now)]
        add, system, topic, start = self.buffer.add, self.system, self.topic, self.start_ns
        for carried, span_id, key in self.items:
            add((SEND, carried, span_id, system, topic, key, start, now, text, events))


CURRENT: ContextVar[Span | Delivery | Webhook | None] = ContextVar("pipeline_span", default=None)
"""The span new spans are children of, and logs name: set inside a recorded span's or a
request's ``with`` (not a request's stages) and while the guard runs."""
