"""The Redis key names the runtime's own stores use, built in one place.

The run guard's keys live with its state (:mod:`pipeline.retry.keys`), the throttle's and the
debouncer's with admission; these are the rest: the idempotency guard's records and the ticker's
claims.
"""

from __future__ import annotations

from pipeline.redis_keys import bounded

__all__ = ["once_key", "tick_key"]


def once_key(prefix: str, lane: str, event: str, name: str) -> str:
    """The record of side effect ``name`` of ``event`` on ``lane``.

    The lane is the hash tag, so one lane's records share a cluster slot. The event id comes
    from the producer (``pl-event-id``): it and ``name``, each longer than
    :data:`~pipeline.redis_keys.NAME_PART_MAX_BYTES` bytes, are named by their digest.
    """
    return f"{{{prefix}:once:{lane}}}:{bounded(event)}:{bounded(name)}"


def tick_key(prefix: str, ticker: str, tick_ms: int) -> str:
    """The claim of one tick of ``ticker`` (so the fleet produces it once)."""
    return f"{prefix}:tick:{ticker}:{tick_ms}"
