"""Ordered retries that keep per-key order, and poison-message detection, held in Redis.

On an ordered lane, when a message fails and goes to a retry tier, its key is *parked*: the
message becomes the key's head, and every later message of that key is diverted behind it (to
the lane's first retry tier) instead of overtaking it. Parked messages carry a sequence number;
only the lowest (the head) runs, the others go round the first tier again, so the order holds
whichever tier each one sits in and whichever member sees it. When the head succeeds the next
one becomes the head; when it is dead-lettered, the ones parked behind it follow it into the
dead-letter topic (``after_dead_letter: follow``) or run normally (``proceed``).

A copy of a parked message can reach a tier twice (a member killed after diverting it, before
committing): when one copy has been handled, the other is recognised (its id is in the key's
``gone`` set) and dropped, so a duplicate never runs out of order behind the key's later messages.

Every start of a message is counted. A message started before without finishing (its member
died, or lost it mid-run) is a *suspect*: the member runs it alone (``runtime/isolation.py``),
so that a crash cannot be blamed on a neighbour that happened to run beside the culprit. Once
its interruptions, the first plus its lone starts, reach ``poison_after``, it is dead-lettered
with reason ``poison`` instead of run again.

If Redis cannot be reached the runtime fails open: messages run (order across retries is not
guarded for that time, and poison is not counted), and each such decision is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from importlib import resources
from typing import Literal

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline import headers as h
from pipeline.envelope import Message
from pipeline.redis_functions import FunctionLibrary
from pipeline.retry.keys import parking_keys
from pipeline.topics.spec import TopicSpec

log = logging.getLogger(__name__)

LIBRARY = resources.files("pipeline.retry").joinpath("lua/parking.lua").read_text()
Decision = Literal["process", "suspect", "divert", "sequenced", "stale"]
Ending = Literal["done", "parked", "dead"]


def message_id(message: Message) -> str:
    """Where the message was first delivered (``topic:partition:offset``), stable across tiers."""
    headers = message.headers
    topic = headers.get(h.ORIGIN_TOPIC)
    if topic is None:
        return f"{message.topic}:{message.partition}:{message.offset}"
    partition = headers.get(h.ORIGIN_PARTITION, b"")
    offset = headers.get(h.ORIGIN_OFFSET, b"")
    return f"{topic.decode()}:{partition.decode()}:{offset.decode()}"


class Parking:
    """Typed wrappers around ``pl_begin`` and ``pl_end`` for one lane."""

    def __init__(self, client: Redis, prefix: str, lane: str, *, ttl_ms: int) -> None:
        """Keep parking state of ``lane`` under ``prefix`` for ``ttl_ms`` after each change."""
        self._functions = FunctionLibrary(client, LIBRARY)
        self._prefix = prefix
        self._lane = lane
        self._ttl_ms = ttl_ms

    async def begin(self, message: Message, *, ordered: bool) -> tuple[Decision, int]:
        """Count a start and decide whether the handler runs; returns (decision, starts)."""
        ident = message_id(message)
        keys = parking_keys(self._prefix, self._lane, message.key, ident)
        try:
            decision, starts = await self._functions.fcall(
                "pl_begin", keys, [ident, self._ttl_ms, "1" if ordered else "0"]
            )
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, processing %s without it: %s", ident, exc)
            return "process", 0
        text = decision.decode() if isinstance(decision, bytes) else str(decision)
        return text, int(starts)  # type: ignore[return-value]

    async def solo(self, message: Message, *, poison_after: int) -> tuple[bool, int]:
        """Count a suspect's lone start; returns (poison, lone starts so far)."""
        ident = message_id(message)
        keys = parking_keys(self._prefix, self._lane, message.key, ident)
        try:
            decision, alone = await self._functions.fcall(
                "pl_solo", keys[4:], [self._ttl_ms, poison_after]
            )
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, running suspect %s without counting: %s", ident, exc)
            return False, 0
        return decision in (b"poison", "poison"), int(alone)

    async def end(self, message: Message, ending: Ending, *, follow_dead: bool) -> None:
        """Record how the message ended (it leaves the parked set unless ``parked``)."""
        ident = message_id(message)
        keys = parking_keys(self._prefix, self._lane, message.key, ident)
        try:
            await self._functions.fcall(
                "pl_end", keys, [ident, self._ttl_ms, ending, "follow" if follow_dead else ""]
            )
        except (rexc.RedisError, OSError) as exc:
            log.warning("parking unavailable, could not record %s of %s: %s", ending, ident, exc)


def lane_parking(client: Redis, prefix: str, specs: Sequence[TopicSpec]) -> dict[str, Parking]:
    """Parking for each lane; its state outlives the lane's longest retry path plus an hour."""
    out = {}
    for spec in specs:
        ttl_ms = max(spec.retry.tiers_ms or (0,)) * (spec.retry.max_attempts + 1) * 2
        out[spec.lane] = Parking(client, prefix, spec.lane, ttl_ms=ttl_ms + 3_600_000)
    return out
