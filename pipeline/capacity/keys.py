"""Every Redis key of the capacity planner; one hash tag per lane keeps a lane on one slot."""

from __future__ import annotations

__all__ = ["arrivals_day", "flushes", "service"]


def _tag(prefix: str, lane: str) -> str:
    return f"{{{prefix}:cap:{lane}}}"


def arrivals_day(prefix: str, lane: str, day: int) -> str:
    """String: the lane's arrivals per minute of UTC day ``day`` (days since 1970-01-01).

    1440 big-endian unsigned 32-bit counters written with BITFIELD (5,760 bytes); expires
    after the retention.
    """
    return f"{_tag(prefix, lane)}:a:{day}"


def service(prefix: str, lane: str) -> str:
    """Hash: the lane's finished messages (``c:MINUTE``) and handler seconds (``s:MINUTE``)."""
    return f"{_tag(prefix, lane)}:svc"


def flushes(prefix: str, lane: str, writer: str) -> str:
    """Hash: ``writer``'s flushes of the lane that Redis applied, by number, until it forgets them.

    A flush sent again after a lost reply finds its number and is not added twice; the writer
    clears the numbers it had replies for with its next flush. Expires with the day keys.
    """
    return f"{_tag(prefix, lane)}:f:{writer}"
