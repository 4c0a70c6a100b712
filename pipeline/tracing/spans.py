"""The span helpers the stages call, each one line at its call site and free when tracing is off.

Every helper starts with ``if _buffer is None`` and then returns a shared no-op (``_NULL``, a
reusable ``nullcontext``) or its input unchanged, so a pipeline without tracing allocates
nothing per message here. :func:`pipeline.tracing.configure` sets ``_buffer`` and ``_sampler``.
When on, the helpers record into :mod:`.record`'s plain objects (a delivery's five spans are
one :class:`~.record.Delivery`); another process makes the OpenTelemetry spans of them.

Attribute names follow the OpenTelemetry messaging semantic conventions (``messaging.*``); the
pipeline's own are under ``pipeline.*``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from contextvars import Token
from typing import TYPE_CHECKING, Any

from pipeline.tracing import record as r
from pipeline.tracing.record import (
    CURRENT,
    Buffer,
    Delivery,
    Sampler,
    Sends,
    Span,
    Stage,
    Webhook,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from pipeline.envelope import Message, Record

__all__ = ["TRACEPARENT", "TRACESTATE", "Delivery"]

TRACEPARENT = "traceparent"
"""The W3C trace context header, on webhooks, log rows and every produced event."""
TRACESTATE = "tracestate"
"""The W3C vendor trace state sent with a ``traceparent``, carried on beside it unchanged."""

_NULL: AbstractContextManager[None] = contextlib.nullcontext()
_buffer: Buffer | None = None
_sampler: Sampler = Sampler(lambda _trace, _name: True, follow=True, always=True)
_system = "redis"
_UNSAMPLED_LAST_DIGIT = "02468ace"
_OWS = " \t"
"""HTTP's optional whitespace around a header's value."""
_UNSAMPLED_LAST_BYTE = _UNSAMPLED_LAST_DIGIT.encode()
_LIFECYCLE = frozenset(
    {"parked", "deferred", "expired", "shed", "duplicate", "retried", "dead_lettered"}
)
"""Outcomes recorded as an event on the process span (``handled`` and ``skipped`` are not)."""


def install(buffer: Buffer | None, sampler: Sampler | None = None, system: str = "redis") -> None:
    """Record into ``buffer`` from now on (None: off), deciding with ``sampler``.

    ``system`` is ``messaging.system``.
    """
    global _buffer, _sampler, _system  # noqa: PLW0603 - the one switch, set at the edge
    _buffer = buffer
    if sampler is not None:
        _sampler = sampler
    _system = "kafka" if system == "kafka" else "redis"


def use_system(system: str) -> None:
    """Name the transport in ``messaging.system`` (``kafka``, else ``redis``)."""
    global _system  # noqa: PLW0603 - set once at the edge, as the buffer
    _system = "kafka" if system == "kafka" else "redis"


def on() -> bool:
    """Whether spans are being recorded."""
    return _buffer is not None


# -- the ingress ------------------------------------------------------------------------------


def webhook(source: str, headers: Mapping[str, str]) -> AbstractContextManager[Any]:
    """The SERVER span of one webhook request, continuing the provider's ``traceparent``.

    Its ``tracestate`` goes on with it; a request with more than one ``traceparent`` (joined
    with ``,`` by the HTTP layer) starts a new trace, as one with an invalid value does.
    """
    if _buffer is None:
        return _NULL
    name = f"POST /hooks/{source}"
    carried = headers.get(TRACEPARENT)
    if carried:  # the HTTP layer keeps whitespace after a value, which is no part of it
        carried = carried.strip(_OWS)
    # Repeated headers come joined with "," (HTTP's rule): more than one is no context at all,
    # even where the first would read as a later version's value.
    parsed = None if carried and "," in carried else r.parse(carried)
    # The provider's tracestate goes on with its context (the W3C rules); without a valid
    # traceparent it is not read.
    state = r.tracestate(headers.get(TRACESTATE)) if parsed is not None else None
    trace_id, parent_id, sampled = _entered(name, parsed)
    if sampled:
        return Webhook(_buffer, source, trace_id, parent_id, state)  # current inside its with
    # Not recorded: it only carries its ids and the "not sampled" flag to what it produces.
    span = Span(_buffer, name, trace_id, parent_id, sampled=False, kind=r.SERVER)
    span.tracestate = state
    return span


def stage(name: str) -> AbstractContextManager[Any]:
    """An INTERNAL child span of the current one (``verify``, ``log commit``).

    Under a request's span it is one of its stages (:class:`~.record.Stage`); elsewhere a span
    of its own, current inside its ``with``.
    """
    if _buffer is None:
        return _NULL
    current = CURRENT.get()
    if type(current) is Webhook:
        return Stage(current, name)
    return _child(_buffer, name, r.INTERNAL)  # current inside its with, ended at its end


def outgoing(headers: Mapping[str, str], tenant: str = "") -> Mapping[str, str]:
    """``headers`` with the current span's ``traceparent``: what a log row keeps of its trace.

    The provider's ``tracestate`` too, when it sent a valid one with a valid ``traceparent``.
    ``tenant`` is recorded on the current (webhook) span as ``pipeline.tenant``.
    """
    if _buffer is None:
        return headers
    current = CURRENT.get()
    if current is None:
        return headers
    if tenant:
        current.set_attribute("pipeline.tenant", tenant)
    state = getattr(current, "tracestate", None)
    if state:
        return {**headers, TRACEPARENT: current.traceparent(), TRACESTATE: state}
    return {**headers, TRACEPARENT: current.traceparent()}


# -- producing --------------------------------------------------------------------------------


def sends_started(topic: str, records: Sequence[Record]) -> Sends | None:
    """One PRODUCER span per record, child of the context its headers carry, and injected.

    Each record's ``traceparent`` becomes its own ``send`` span's, so the consumer's spans are
    children of the produce. End them with :func:`sends_ended` once the broker answered.
    """
    if _buffer is None:
        return None
    sends = Sends(_buffer, _system, topic)
    name = f"send {topic}"
    follow, always = _sampler.follow, _sampler.always
    items = sends.items
    for record in records:
        carried = dict(record.headers) if record.headers else {}
        raw = carried.get(TRACEPARENT)
        if _unsampled(raw):
            continue  # the header goes on as it is: the trace stays unsampled downstream
        span_id = r.new_span_id()
        if (follow or always is not None) and r.spliceable(raw):
            # The usual case (a value this process wrote): the ids stay as they are, the
            # exporting process reads them; only the span id is put in.
            sampled = True if follow else bool(always)  # follow: _unsampled() saw it sampled
            carried[TRACEPARENT] = b"%b%016x-%s" % (raw[:36], span_id, b"01" if sampled else b"00")
            record.headers = carried
            if sampled:
                items.append((raw, span_id, record.key))
            continue
        trace_id, parent_id, sampled = _entered(name, r.parse(raw))
        carried[TRACEPARENT] = r.traceparent(trace_id, span_id, sampled=sampled).encode()
        record.headers = carried
        if sampled:
            items.append(((trace_id, parent_id), span_id, record.key))
    return sends


def sends_ended(sends: Sends | None, error: BaseException | None = None) -> None:
    """End the spans of :func:`sends_started`, marked failed when ``error`` is given."""
    if sends is not None:
        sends.end(error)


def sending(
    topic: str, headers: dict[str, bytes], route: str, reason: str = ""
) -> AbstractContextManager[Any]:
    """A PRODUCER span around one routed send (``retry``, ``divert``, ``dead_letter``).

    A child of the current span (the delivery's ``guard``), else of the context ``headers``
    carry; its context replaces their ``traceparent``, so the copy's next delivery continues
    the same trace.
    """
    if _buffer is None:
        return _NULL
    name = f"send {topic}"
    if CURRENT.get() is not None:
        span = _child(_buffer, name, r.PRODUCER)
    else:  # routed outside a delivery (a debounced turn's)
        carried = headers.get(TRACEPARENT)
        if _unsampled(carried):
            return _NULL  # the copy keeps the unsampled context
        span = _entering(_buffer, name, r.parse(carried), r.PRODUCER)
    span.attributes = r.send_attributes(_system, topic, None)
    span.attributes["pipeline.route"] = route
    if reason:
        span.attributes["pipeline.dead_reason"] = reason
    headers[TRACEPARENT] = span.traceparent().encode()
    return span  # current inside its with, ended at its end


# -- consuming --------------------------------------------------------------------------------


def process(message: Message, lane: str, group: str = "") -> Delivery | None:
    """Open the CONSUMER span of a polled message, after its ``partition wait`` span.

    ``group``: the consumer group processing it (``messaging.consumer.group.name``).

    Both are children of the ``traceparent`` the message carries (a message without one starts
    a trace: its ``process`` span is the root and the wait its child); the wait runs from the
    message's produce timestamp to now. The attributes are made from the message's fields by
    the exporting process, not here.
    """
    if _buffer is None:
        return None
    headers = message.headers
    raw = headers.get(TRACEPARENT)
    if _unsampled(raw):
        return None
    ids = None
    if not _sampler.always:  # a sampler that looks at the trace id (or drops everything)
        carried = r.parse(raw)
        remote = None if carried is None else carried[2]
        ids = (carried[0], carried[1]) if carried is not None else (r.new_trace_id(), 0)
        if not _sampler.sampled(ids[0], message.topic, remote):
            return None
    return Delivery(_buffer, raw, ids, message, lane, _system, group)


def admitted(delivery: Delivery | None) -> None:
    """Note that the delivery passed its lane's throttle (it enters the key lanes now)."""
    if delivery is not None:
        delivery.admitted_ns = time.time_ns()


def throttle_waited(delivery: Delivery | None, keys: Sequence[str], priority: int) -> None:
    """Record the ``throttle wait`` span: from entry until admission, with keys and priority."""
    if delivery is None or not delivery.admitted_ns:
        return
    delivery.keys = tuple(keys)
    delivery.priority = priority


def guard(delivery: Delivery | None) -> AbstractContextManager[Any]:
    """The ``guard`` span, current (under the delivery's ``process``) while the guard runs."""
    if delivery is None:
        return _NULL
    return _guarding(delivery)


def guard_entered(delivery: Delivery) -> Token[Any]:
    """The ``guard`` span starts and is current; pass the token to :func:`guard_left`.

    The chain calls the two around its await of the guard, in its own task, so a delivery's
    guard costs no coroutine of its own.
    """
    delivery.guard_start_ns = time.time_ns()
    return CURRENT.set(delivery)


def guard_left(delivery: Delivery, token: Token[Any]) -> None:
    """The ``guard`` span ends and is no longer current."""
    CURRENT.reset(token)
    delivery.guard_end_ns = time.time_ns()


@contextlib.contextmanager
def _guarding(delivery: Delivery) -> Iterator[Delivery]:
    token = guard_entered(delivery)
    try:
        yield delivery
    finally:
        guard_left(delivery, token)


def handler_ran(lane: str, started_s: float, error: BaseException | None) -> None:
    """Record the ``handler`` span: from ``started_s`` (``time.perf_counter``) until now.

    Only under a recorded delivery's ``guard`` or a turn: the handler of a message whose trace
    is not sampled records nothing.
    """
    if _buffer is None:
        return
    current = CURRENT.get()
    if current is None:
        return
    end_ns = time.time_ns()  # the start from the same clock: the wall clock may have stepped
    start_ns = end_ns - int((time.perf_counter() - started_s) * 1e9)
    if isinstance(current, Delivery) and not current.handler_start_ns:
        if error is not None:
            current.failure = (type(error).__name__, r.exception_event(error, end_ns))
        current.handler_start_ns = start_ns
        current.handler_end_ns = end_ns
        return
    span = _child(_buffer, "handler", r.INTERNAL, start_ns)
    span.attributes = {"pipeline.lane": lane}
    if error is not None:
        span.fail(error)
    span.end(end_ns)


def event(name: str, detail: str = "") -> None:
    """Add a lifecycle event (``poison``, ``diverted``...) to the current span."""
    if _buffer is None:
        return
    current = CURRENT.get()
    if current is not None:
        current.add_event(name, {"pipeline.detail": detail} if detail else None)


def finish(delivery: Delivery | None, outcome: str | None) -> None:
    """End the delivery's ``process`` span with its outcome (an event for lifecycle ones)."""
    if delivery is not None:
        delivery.end(outcome, outcome in _LIFECYCLE)


def turn(
    lane: str, messages: Sequence[Message], first_ms: int, fired_ms: int, group: str = ""
) -> AbstractContextManager[Any]:
    """The CONSUMER span of a debounced turn, linked to each message it coalesced.

    Its ``debounce wait`` child runs from the turn's first message (``first_ms``) to when it
    fired (``fired_ms``, both ms since the epoch); the span is current while the handler runs.
    ``group``: the consumer group running it (``messaging.consumer.group.name``).
    """
    if _buffer is None:
        return _NULL
    links = []
    for message in messages:
        carried = r.parse(message.headers.get(TRACEPARENT))
        if carried is not None:
            links.append((carried[0], carried[1]))
    span = _entering(_buffer, f"process {lane} turn", None, r.CONSUMER)
    span.links = links
    span.attributes = {
        "messaging.system": _system,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.batch.message_count": len(messages),
        "pipeline.lane": lane,
    }
    if group:
        span.attributes["messaging.consumer.group.name"] = group
    if first_ms:
        wait = Span(
            _buffer,
            "debounce wait",
            span.trace_id,
            span.span_id,
            span.sampled,
            start_ns=first_ms * 1_000_000,
        )
        wait.end(max(fired_ms, first_ms) * 1_000_000)
    return span  # current inside its with, ended at its end


# -- helpers ----------------------------------------------------------------------------------


def _entering(
    buffer: Buffer,
    name: str,
    carried: tuple[int, int, bool] | None,
    kind: str,
    start_ns: int = 0,
) -> Span:
    """A span where a trace enters this process: under ``carried``, else a new trace."""
    trace_id, parent_id, sampled = _entered(name, carried)
    return Span(buffer, name, trace_id, parent_id, sampled, kind=kind, start_ns=start_ns)


def _entered(name: str, carried: tuple[int, int, bool] | None) -> tuple[int, int, bool]:
    """(trace id, parent span id or 0, sampled) where a trace enters this process.

    Under ``carried`` (a parsed ``traceparent``), else a new trace; the sampler decides.
    """
    if carried is None:
        trace_id = r.new_trace_id()
        return trace_id, 0, _sampler.sampled(trace_id, name, None)
    trace_id, parent_id, flag = carried
    return trace_id, parent_id, _sampler.sampled(trace_id, name, flag)


def _child(buffer: Buffer, name: str, kind: str, start_ns: int = 0) -> Span:
    """A child of the current span, or a new trace when there is none."""
    current = CURRENT.get()
    if current is None:
        return _entering(buffer, name, None, kind, start_ns)
    return Span(
        buffer,
        name,
        current.trace_id,
        current.span_id,
        current.sampled,
        kind=kind,
        start_ns=start_ns,
    )


def _unsampled(raw: bytes | str | None) -> bool:
    """Whether ``raw`` is a valid ``traceparent`` whose sampled flag is off, and that decides.

    The flag is the low bit of the last hex digit: a value of version 00's length ending in an
    odd digit is not unsampled, whatever else it holds, so a sampled message costs a few
    operations. A malformed value is no context at all (a new trace), not an unsampled one.
    """
    if not _sampler.follow or not raw or len(raw) < r.TRACEPARENT_CHARS:
        return False
    if len(raw) == r.TRACEPARENT_CHARS:
        digits = _UNSAMPLED_LAST_DIGIT if isinstance(raw, str) else _UNSAMPLED_LAST_BYTE
        if raw[-1:] not in digits:  # type: ignore[operator] # str in str, bytes in bytes
            return False
        if r.spliceable(raw):
            return True
    carried = r.parse(raw)  # text, another version, or malformed
    return carried is not None and not carried[2]
