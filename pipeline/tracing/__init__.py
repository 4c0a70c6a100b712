"""Tracing: one OpenTelemetry trace per event, from the webhook to its last handler run.

Off by default and then free: no SDK is imported and every helper of :mod:`.spans` returns at
its first line without allocating. :func:`configure` turns it on from the standard ``OTEL_*``
variables (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``, ...) when the ``pipeline[otel]`` extra is
installed. The context travels as a W3C ``traceparent`` header (with the provider's
``tracestate`` when it sent one): kept with the ingress log row, carried by every event, retry
copy, held follower, dead letter and redriven message, so one event's retries and redrives stay
one trace. The spans, in the order an event meets them::

    POST /hooks/{source}       SERVER    the webhook request (continues the provider's traceparent)
      verify                   INTERNAL  signature check
      log commit               INTERNAL  durable insert into the log store (group commit)
      send {topic}             PRODUCER  produce until the broker acknowledged (fast path, sweeper,
                                         replay, redrive, retry tier, dead-letter topic)
        partition wait         INTERNAL  from the produce to the member's poll
        process {topic}        CONSUMER  the member's work on one delivery, poll to settle
          throttle wait        INTERNAL  waiting for the lane's throttle slots (keys, priority)
          guard                INTERNAL  the run guard's decision and the run it allows
            handler            INTERNAL  the user's handler
            send {retry topic} PRODUCER  retry scheduling or dead-lettering, and so on
    process {lane} turn        CONSUMER  a debounced turn, linked to every message it coalesced
      debounce wait            INTERNAL  from the turn's first message to its firing

Lifecycle outcomes are span events: the delivery's outcome (parked, deferred, shed, expired,
retried, dead-lettered, duplicate) on its ``process`` span; ``diverted`` and the dead-letter
reason (poison, fatal, exhausted, expired, shed, sequenced) on the ``guard`` span, current while
the message is routed. Span names, kinds and ``messaging.*`` attributes follow
the OpenTelemetry messaging semantic conventions.
"""

from __future__ import annotations

from pipeline.tracing.setup import TracingUnavailable, configure, shutdown
from pipeline.tracing.spans import (
    TRACEPARENT,
    TRACESTATE,
    Delivery,
    admitted,
    event,
    finish,
    guard,
    guard_entered,
    guard_left,
    handler_ran,
    on,
    outgoing,
    process,
    sending,
    sends_ended,
    sends_started,
    stage,
    throttle_waited,
    turn,
    use_system,
    webhook,
)

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "Delivery",
    "TracingUnavailable",
    "admitted",
    "configure",
    "event",
    "finish",
    "guard",
    "guard_entered",
    "guard_left",
    "handler_ran",
    "on",
    "outgoing",
    "process",
    "sending",
    "sends_ended",
    "sends_started",
    "shutdown",
    "stage",
    "throttle_waited",
    "turn",
    "use_system",
    "webhook",
]
