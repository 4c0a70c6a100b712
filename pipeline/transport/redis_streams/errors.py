"""Translation of redis-py errors into :mod:`pipeline.errors` at the boundary."""

from __future__ import annotations

from redis import exceptions as rexc

from pipeline.errors import BrokerUnavailable, TransportError


def translate(error: rexc.RedisError, context: str) -> TransportError:
    """Map a redis-py error to the matching :class:`~pipeline.errors.TransportError`."""
    if isinstance(error, (rexc.ConnectionError, rexc.TimeoutError)):
        return BrokerUnavailable(f"{context}: redis unreachable: {error}")
    return TransportError(f"{context}: {error}")
