"""Translation of redis-py errors into :mod:`pipeline.errors` at the boundary."""

from __future__ import annotations

import re

from redis import exceptions as rexc

from pipeline.errors import BrokerUnavailable, TransportError

_PIPELINED_KEY = re.compile(r"^Command # \d+ \(\S+ ([^\s)]+)")
"""The key of the command a redis-py pipeline names in its error: ``Command # 2 (XLEN k)``."""


FULL = (
    "Redis is full (used memory above its maxmemory, noeviction): it refuses writes, so "
    "producers cannot send and members cannot join, renew or commit; give it memory (`CONFIG "
    "SET maxmemory`, a larger instance) or free some: lower the topics' max_len (`pipeline "
    "topics apply`) and `XTRIM` their streams"
)
"""What an OOM reply means for the transport: reading members do not free a stream's memory."""


def is_full(text: str) -> bool:
    """Whether Redis's reply ``text`` refused a write because it reached ``maxmemory``."""
    return text.startswith("OOM ") or "used memory > 'maxmemory'" in text


def is_wrong_type(text: str) -> bool:
    """Whether Redis's reply ``text`` says a key holds another type than the command's."""
    return "WRONGTYPE" in text


def translate(error: rexc.RedisError, context: str) -> TransportError:
    """Map a redis-py error to the matching :class:`~pipeline.errors.TransportError`."""
    if isinstance(error, (rexc.ConnectionError, rexc.TimeoutError)):
        return BrokerUnavailable(f"{context}: redis unreachable: {error}")
    if is_full(str(error)):
        return TransportError(f"{context}: {FULL}")
    if is_wrong_type(str(error)):
        return TransportError(f"{context}: {_wrong_type(str(error))}")
    return TransportError(f"{context}: {error}")


def _wrong_type(text: str) -> str:
    """What a WRONGTYPE reply means, naming the key where redis-py's error names it."""
    found = _PIPELINED_KEY.match(text)
    if found is None:
        return (
            "a Redis key of it holds no stream (WRONGTYPE): something other than pipeline wrote "
            "one under PIPELINE_REDIS__KEY_PREFIX; find it (`pipeline topics list` names it) "
            "and delete it"
        )
    return f"{no_stream(found.group(1))}: the partition's stream is made again at its next message"


def no_stream(key: str) -> str:
    """A stream key of another type named, with what to do: every line saying so words it so."""
    return (
        f"Redis key {key!r} holds no stream (WRONGTYPE): something other than pipeline wrote "
        f"it; look at it (`redis-cli TYPE {key}`) and delete it (`redis-cli DEL {key}`)"
    )


def wrong_type_of_partition(stream: str, sequence: str) -> str:
    """What a WRONGTYPE reply to ``pl_produce`` means: one of the partition's two keys."""
    return (
        f"Redis key {stream!r} (the partition's stream) or {sequence!r} (its offset counter) "
        "holds another type (WRONGTYPE): something other than pipeline wrote it; look at them "
        "(`redis-cli TYPE KEY`) and delete the one that is no stream, no integer: a deleted "
        "stream is made again at the next message"
    )
