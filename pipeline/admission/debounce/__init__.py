"""The coalescing debouncer: one turn per conversation burst, every message in order.

``debouncer`` (:class:`Debouncer`, :class:`Turn`: record, claim, finish), ``runner``
(:class:`TurnRunner`, woken by Redis rather than polling), ``functions`` (typed wrappers around
``lua/debounce.lua``), ``keys`` (every key name) and ``codec`` (the buffered form of a message).
"""

from pipeline.admission.debounce.codec import BufferedMessage
from pipeline.admission.debounce.debouncer import (
    Claim,
    Debouncer,
    DebounceStats,
    Finish,
    Renewal,
    Step,
    Turn,
)
from pipeline.admission.debounce.runner import TurnRunner, exponential_backoff_ms

__all__ = [
    "BufferedMessage",
    "Claim",
    "DebounceStats",
    "Debouncer",
    "Finish",
    "Renewal",
    "Step",
    "Turn",
    "TurnRunner",
    "exponential_backoff_ms",
]
