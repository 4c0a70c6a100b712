"""The span helpers the stages call, each one line at its call site and free when tracing is off.

Every helper starts with ``if _tracer is None`` and then returns a shared no-op (``_NULL``, a
reusable ``nullcontext``) or its input unchanged, so a pipeline without tracing allocates
nothing per message here. :func:`pipeline.tracing.configure` sets ``_tracer``.

Attribute names follow the OpenTelemetry messaging semantic conventions (``messaging.*``); the
pipeline's own are under ``pipeline.*``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pipeline import headers as h

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from pipeline.envelope import Message, Record

T = TypeVar("T")
TRACEPARENT = "traceparent"
"""The W3C trace context header, on webhooks, log rows and every produced event."""

_NULL: AbstractContextManager[None] = contextlib.nullcontext()
_PROPAGATOR = TraceContextTextMapPropagator()
_tracer: trace.Tracer | None = None
_system = "redis"
_follow_parent = True
"""Whether the sampler keeps a carried decision (the parent-based ones, the SDK's default):
then a delivery or produce whose ``traceparent`` says "not sampled" records nothing at all."""
_UNSAMPLED_LAST_DIGIT = "02468ace"
_TRACEPARENT_CHARS = 55
_EPOCH_NS = time.time_ns() - time.perf_counter_ns()
"""Adds to a ``time.perf_counter`` reading (as ns) to make it a wall-clock time in ns."""
_LIFECYCLE = frozenset(
    {"parked", "deferred", "expired", "shed", "duplicate", "retried", "dead_lettered"}
)
"""Outcomes recorded as an event on the process span (``handled`` and ``skipped`` are not)."""


def install(
    tracer: trace.Tracer | None, system: str = "redis", *, follow_parent: bool = True
) -> None:
    """Use ``tracer`` from now on (None: off); ``system`` is ``messaging.system``.

    ``follow_parent``: the tracer's sampler keeps the decision a ``traceparent`` carries.
    """
    global _tracer, _system, _follow_parent  # noqa: PLW0603 - the one switch, set at the edge
    _tracer = tracer
    _system = "kafka" if system == "kafka" else "redis"
    _follow_parent = follow_parent


def use_system(system: str) -> None:
    """Name the transport in ``messaging.system`` (``kafka``, else ``redis``)."""
    global _system  # noqa: PLW0603 - set once at the edge, as the tracer
    _system = "kafka" if system == "kafka" else "redis"


def on() -> bool:
    """Whether spans are being recorded."""
    return _tracer is not None


# -- the ingress ------------------------------------------------------------------------------


def webhook(source: str, headers: Mapping[str, str]) -> AbstractContextManager[Any]:
    """The SERVER span of one webhook request, continuing the provider's ``traceparent``."""
    if _tracer is None:
        return _NULL
    return _tracer.start_as_current_span(
        f"POST /hooks/{source}",
        context=_PROPAGATOR.extract(headers),
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": "POST",
            "http.route": "/hooks/{source}",
            "pipeline.source": source,
        },
    )


def stage(name: str) -> AbstractContextManager[Any]:
    """An INTERNAL child span of the current one (``verify``, ``log commit``)."""
    if _tracer is None:
        return _NULL
    return _tracer.start_as_current_span(name)


def outgoing(headers: Mapping[str, str], tenant: str = "") -> Mapping[str, str]:
    """``headers`` with the current span's ``traceparent``: what a log row keeps of its trace.

    ``tenant`` is recorded on the current (webhook) span as ``pipeline.tenant``.
    """
    if _tracer is None:
        return headers
    if tenant:
        trace.get_current_span().set_attribute("pipeline.tenant", tenant)
    carrier = dict(headers)
    _PROPAGATOR.inject(carrier)
    return carrier


# -- producing --------------------------------------------------------------------------------


def sends_started(topic: str, records: Sequence[Record]) -> list[trace.Span] | None:
    """One PRODUCER span per record, child of the context its headers carry, and injected.

    Each record's ``traceparent`` becomes its own ``send`` span's, so the consumer's spans are
    children of the produce. End them with :func:`sends_ended` once the broker answered.
    """
    if _tracer is None:
        return None
    spans = []
    now = time.time_ns()
    for record in records:
        carried = dict(record.headers) if record.headers else {}
        if _unsampled(carried.get(TRACEPARENT)):
            continue  # the header goes on as it is: the trace stays unsampled downstream
        span = _tracer.start_span(
            f"send {topic}",
            context=_parent(carried.get(TRACEPARENT)),
            kind=SpanKind.PRODUCER,
            start_time=now,
            attributes=_send_attributes(topic, record.key),
        )
        carried[TRACEPARENT] = _traceparent(span)
        record.headers = carried
        spans.append(span)
    return spans


def sends_ended(spans: list[trace.Span] | None, error: BaseException | None = None) -> None:
    """End the spans of :func:`sends_started`, marked failed when ``error`` is given."""
    if spans is None:
        return
    now = time.time_ns()
    for span in spans:
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end(now)


def sending(
    topic: str, headers: dict[str, bytes], route: str, reason: str = ""
) -> AbstractContextManager[Any]:
    """A PRODUCER span around one routed send (``retry``, ``divert``, ``dead_letter``).

    A child of the current span (the delivery's ``guard``), else of the context ``headers``
    carry; its context replaces their ``traceparent``, so the copy's next delivery continues
    the same trace.
    """
    if _tracer is None:
        return _NULL
    parent = None  # the current span: the delivery's guard
    if not trace.get_current_span().get_span_context().is_valid:
        carried = headers.get(TRACEPARENT)  # routed outside a delivery (a debounced turn's)
        if _unsampled(carried):
            return _NULL  # the copy keeps the unsampled context
        parent = _parent(carried)
    return _routed(_tracer, topic, headers, route, reason, parent)


@contextlib.contextmanager
def _routed(
    tracer: trace.Tracer,
    topic: str,
    headers: dict[str, bytes],
    route: str,
    reason: str,
    parent: Context | None,
) -> Iterator[None]:
    attributes = _send_attributes(topic, None)
    attributes["pipeline.route"] = route
    if reason:
        attributes["pipeline.dead_reason"] = reason
    with tracer.start_as_current_span(
        f"send {topic}", context=parent, kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        headers[TRACEPARENT] = _traceparent(span)
        yield


# -- consuming --------------------------------------------------------------------------------


@dataclass(slots=True)
class Delivery:
    """The ``process`` span of one delivery and when it entered and was admitted (ns)."""

    span: trace.Span
    entered_ns: int
    admitted_ns: int = 0


def process(message: Message, lane: str) -> Delivery | None:
    """Open the CONSUMER span of a polled message, after its ``partition wait`` span.

    Both are children of the ``traceparent`` the message carries (a message without one starts
    a trace: its ``process`` span is the root and the wait its child); the wait runs from the
    message's produce timestamp to now.
    """
    if _tracer is None:
        return None
    carried = message.headers.get(TRACEPARENT)
    if _unsampled(carried):
        return None
    now = time.time_ns()
    parent = _parent(carried)
    attributes: dict[str, Any] = {
        "messaging.system": _system,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": message.topic,
        "messaging.destination.partition.id": str(message.partition),
        "messaging.message.id": f"{message.partition}-{message.offset}",
        "pipeline.lane": lane,
        "pipeline.attempt": h.int_header(message.headers, h.ATTEMPT, 1),
        "pipeline.delivery_count": message.delivery_count,
    }
    tenant = message.headers.get(h.TENANT)
    if tenant:
        attributes["pipeline.tenant"] = tenant.decode(errors="replace")
    if _system == "kafka":
        attributes["messaging.kafka.offset"] = message.offset
    if message.key is not None:
        attributes["messaging.kafka.message.key"] = message.key.decode(errors="replace")
    span = _tracer.start_span(
        f"process {message.topic}",
        context=parent,
        kind=SpanKind.CONSUMER,
        start_time=now,
        attributes=attributes,
    )
    produced = min(message.timestamp_ms * 1_000_000, now) if message.timestamp_ms else now
    _tracer.start_span(
        "partition wait",
        context=parent or trace.set_span_in_context(span),
        start_time=produced,
        attributes={"messaging.destination.partition.id": str(message.partition)},
    ).end(now)
    return Delivery(span, now)


def admitted(delivery: Delivery | None) -> None:
    """Note that the delivery passed its lane's throttle (it enters the key lanes now)."""
    if delivery is not None:
        delivery.admitted_ns = time.time_ns()


def throttle_waited(delivery: Delivery | None, keys: Sequence[str], priority: int) -> None:
    """Record the ``throttle wait`` span: from entry until admission, with keys and priority."""
    if delivery is None or _tracer is None or not delivery.admitted_ns:
        return
    _tracer.start_span(
        "throttle wait",
        context=trace.set_span_in_context(delivery.span),
        start_time=delivery.entered_ns,
        attributes={"pipeline.throttle.keys": list(keys), "pipeline.throttle.priority": priority},
    ).end(max(delivery.admitted_ns, delivery.entered_ns))


def guard(delivery: Delivery | None) -> AbstractContextManager[Any]:
    """The ``guard`` span, current (under the delivery's ``process``) while the guard runs."""
    if delivery is None or _tracer is None:
        return _NULL
    return _tracer.start_as_current_span("guard", context=trace.set_span_in_context(delivery.span))


def guarded(delivery: Delivery | None, run: Awaitable[T]) -> Awaitable[T]:
    """``run`` (the guard and the handler after it) inside the ``guard`` span, if any.

    With no delivery (tracing off) ``run`` itself is returned: no context manager is entered.
    """
    if delivery is None or _tracer is None:
        return run
    return _guarded(_tracer, delivery, run)


async def _guarded(tracer: trace.Tracer, delivery: Delivery, run: Awaitable[T]) -> T:
    with tracer.start_as_current_span("guard", context=trace.set_span_in_context(delivery.span)):
        return await run


def handler_ran(lane: str, started_s: float, error: BaseException | None) -> None:
    """Record the ``handler`` span: from ``started_s`` (``time.perf_counter``) until now."""
    if _tracer is None:
        return
    span = _tracer.start_span(
        "handler",
        start_time=_EPOCH_NS + int(started_s * 1e9),
        attributes={"pipeline.lane": lane},
    )
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
    span.end()


def event(name: str, detail: str = "") -> None:
    """Add a lifecycle event (``poison``, ``diverted``...) to the current span."""
    if _tracer is None:
        return
    span = trace.get_current_span()
    if detail:
        span.add_event(name, {"pipeline.detail": detail})
    else:
        span.add_event(name)


def finish(delivery: Delivery | None, outcome: str | None) -> None:
    """End the delivery's ``process`` span with its outcome (an event for lifecycle ones)."""
    if delivery is None:
        return
    span = delivery.span
    span.set_attribute("pipeline.outcome", outcome or "unrouted")
    if outcome in _LIFECYCLE:
        span.add_event(outcome)
    elif outcome is None:
        span.set_status(Status(StatusCode.ERROR, "could not be routed; delivered again"))
    span.end()


def turn(
    lane: str, messages: Sequence[Message], first_ms: int, fired_ms: int
) -> AbstractContextManager[Any]:
    """The CONSUMER span of a debounced turn, linked to each message it coalesced.

    Its ``debounce wait`` child runs from the turn's first message (``first_ms``) to when it
    fired (``fired_ms``, both ms since the epoch); the span is current while the handler runs.
    """
    if _tracer is None:
        return _NULL
    return _turn(_tracer, lane, messages, first_ms, fired_ms)


@contextlib.contextmanager
def _turn(
    tracer: trace.Tracer, lane: str, messages: Sequence[Message], first_ms: int, fired_ms: int
) -> Iterator[None]:
    links = []
    for message in messages:
        parent = _parent(message.headers.get(TRACEPARENT))
        context = trace.get_current_span(parent).get_span_context()
        if context.is_valid:
            links.append(Link(context))
    attributes: dict[str, Any] = {
        "messaging.system": _system,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.batch.message_count": len(messages),
        "pipeline.lane": lane,
    }
    with tracer.start_as_current_span(
        f"process {lane} turn", kind=SpanKind.CONSUMER, links=links, attributes=attributes
    ):
        if first_ms:
            tracer.start_span("debounce wait", start_time=first_ms * 1_000_000).end(
                max(fired_ms, first_ms) * 1_000_000
            )
        yield


# -- helpers ----------------------------------------------------------------------------------


def _unsampled(raw: bytes | str | None) -> bool:
    """Whether ``raw`` is a ``traceparent`` whose sampled flag is off, and that decides.

    The flag is the low bit of the last hex digit; parsing stops there, so an unsampled
    message costs a few operations.
    """
    if not _follow_parent or not raw or len(raw) != _TRACEPARENT_CHARS:
        return False
    last = raw[-1:]
    return (last.decode() if isinstance(last, bytes) else last) in _UNSAMPLED_LAST_DIGIT


def _parent(raw: bytes | str | None) -> Context | None:
    """The context a ``traceparent`` value names, or None (a new trace) when there is none."""
    if not raw:
        return None
    value = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    return _PROPAGATOR.extract({TRACEPARENT: value})


def _traceparent(span: trace.Span) -> bytes:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT, "").encode()


def _send_attributes(topic: str, key: bytes | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": _system,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": topic,
    }
    if key is not None:
        attributes["messaging.kafka.message.key"] = key.decode(errors="replace")
    return attributes
