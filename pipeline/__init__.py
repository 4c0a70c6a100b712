"""pipeline: webhook events carried from the door to their handlers, nothing accepted lost.

The packages are the stages, in the order an event travels::

    ingress ─▶ logstore ─▶ transport ─▶ runtime ─▶ admission ─▶ retry ─▶ redrive
    (verify,   (durable     (Kafka or     (consumer   (fair        (tiers,   (dead letters
     route)     log)         Redis         members,    throttles)   DLQ)      back in)
                             Streams)      handlers)

Beside the flow: ``config`` (the settings), ``errors`` (the exception tree), ``envelope`` and
``headers`` (the message every stage sees), ``topics`` (declarations), ``registry`` (schemas),
``observability`` (metrics), ``tracing`` (spans), ``capacity`` (sizing), ``testing`` (doubles
for users' tests), ``cli`` with ``cli_support`` and ``cli_progress``, ``redis_functions`` with
``redis_channel``, ``redis_keys`` (key-name parts from messages, bounded), ``heap`` (a serving
process's heap: start-up objects kept out of full collections, freed memory handed back when
quiet), ``times`` (how an instant is written), ``descriptors`` (the open-file limit raised at
start), ``startup`` (what every command does first: logging from the environment, then the open-file
limit), ``log_repeats``, ``reachability`` (the line for a service that is down), ``cancel_tasks``
(stopping tasks though a cancellation is lost below them) and ``validation``.
Import what you use from its module (``from pipeline.runtime import App``); ``__all__`` names
these modules, as docs/architecture.md does.
"""

__all__ = [
    "admission",
    "cancel",
    "cancel_tasks",
    "capacity",
    "cli",
    "cli_progress",
    "cli_support",
    "config",
    "descriptors",
    "envelope",
    "errors",
    "event_bodies",
    "headers",
    "heap",
    "ingress",
    "log_repeats",
    "logstore",
    "observability",
    "offload",
    "quiet_stop",
    "reachability",
    "redis_channel",
    "redis_functions",
    "redis_keys",
    "redrive",
    "registry",
    "retry",
    "runtime",
    "startup",
    "testing",
    "times",
    "topics",
    "tracing",
    "transport",
    "validation",
]
