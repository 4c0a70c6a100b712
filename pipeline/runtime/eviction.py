"""Say at ``pipeline consume`` start when the member's Redis may lose what only it keeps.

A follower held behind a parked key (an ordered lane with retry tiers) and a message waiting in
a debounce buffer have their offsets committed: Redis keeps their only copy. A Redis with
``maxmemory`` and an eviction policy drops keys under memory pressure, silently: a ``volatile-*``
policy the keys that have an expiry, which every key of the run guard has (a parked key's held
followers among them), an ``allkeys-*`` policy any key, debounce buffers too. Only
``noeviction`` (writes refused when full, which the runtime fails open on, logged) loses
nothing. The member reads the two settings once (``CONFIG GET``) and logs one warning line; a
managed Redis that refuses ``CONFIG`` (or a Redis out of reach) makes it say nothing. The
buffers of a lane no longer debounced are turned by no member: one warning line per lane too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis

from pipeline.reachability import safe_url
from pipeline.redis_functions import FAILED
from pipeline.runtime.app import Lane
from pipeline.runtime.guard import ordered_retries

log = logging.getLogger(__name__)


def config_value(reply: Mapping[Any, Any], default: str) -> str:
    """The one setting a ``CONFIG GET`` of one name answered, as text (``default`` if none)."""
    value = next(iter(reply.values()), default)
    return value.decode() if isinstance(value, bytes) else str(value)


def holding_lanes(lanes: Sequence[Lane]) -> list[Lane]:
    """The lanes of ``lanes`` that hold followers of parked keys in Redis (ordered, retry tiers)."""
    return [lane for lane in lanes if ordered_retries(lane)]


def buffering_lanes(lanes: Sequence[Lane]) -> list[Lane]:
    """The lanes of ``lanes`` that buffer messages in Redis for their debounced turns."""
    return [lane for lane in lanes if lane.turns]


def held_text(lanes: Sequence[Lane]) -> str:
    """``held followers of parked keys (lanes a, b)``."""
    return f"held followers of parked keys (lanes {', '.join(lane.name for lane in lanes)})"


def buffers_text(lanes: Sequence[Lane]) -> str:
    """``debounce buffers (lanes a, b)``."""
    return f"debounce buffers (lanes {', '.join(lane.name for lane in lanes)})"


def kept_only_in_redis(lanes: Sequence[Lane]) -> list[str]:
    """What of ``lanes``' messages only Redis keeps: held followers, debounce buffers (or none)."""
    out = []
    if holding := holding_lanes(lanes):
        out.append(held_text(holding))
    if buffering := buffering_lanes(lanes):
        out.append(buffers_text(buffering))
    return out


def what_it_evicts(policy: str, lanes: Sequence[Lane]) -> list[str]:
    """What of ``lanes``' state in Redis an eviction ``policy`` can drop (empty: nothing)."""
    if not policy.startswith(("volatile-", "allkeys-")):  # noeviction
        return []
    holding, buffering = holding_lanes(lanes), buffering_lanes(lanes)
    out = []
    if holding:
        out.append(held_text(holding))
    if buffering and policy.startswith("allkeys-"):  # no expiry on buffers: volatile-* spares them
        out.append(buffers_text(buffering))
    if out:
        out[-1] += ", whose offsets are committed (Redis holds their only copy)"
    else:
        out.append("the run guard's start marks (a crash then goes uncounted towards poison)")
    return out


async def warn_if_evicting(redis: Redis, url: str, lanes: Sequence[Lane]) -> str | None:
    """Log one warning if the Redis at ``url`` may evict state of ``lanes``; the line, or None.

    Reads ``maxmemory`` and ``maxmemory-policy`` (``CONFIG GET``): a warning when the first is
    above 0 and the second is not ``noeviction``. Says nothing when the Redis refuses ``CONFIG``
    (managed services often do) or cannot be reached (the runtime says so on its first call).
    """
    try:
        memory = await redis.config_get("maxmemory")
        policy_reply = await redis.config_get("maxmemory-policy")
    except FAILED as exc:
        log.debug("could not read the eviction policy of Redis %s: %s", safe_url(url), exc)
        return None
    maxmemory = int(config_value(memory, "0") or 0)
    policy = config_value(policy_reply, "noeviction")
    evicts = what_it_evicts(policy, lanes)
    if maxmemory <= 0 or not evicts:
        return None
    line = (
        f"Redis {safe_url(url)} has maxmemory {maxmemory} bytes and maxmemory-policy {policy}: "
        f"when full it silently evicts {' and '.join(evicts)}; "
        "set maxmemory-policy noeviction"
    )
    log.warning(line)
    return line


async def warn_stranded(redis: Redis, prefix: str, lanes: Sequence[Lane]) -> list[str]:
    """Log a warning for each of ``lanes`` whose Redis state its declaration no longer releases.

    A lane no longer debounced with conversations still buffered: no member turns them
    (:func:`pipeline.topics.stranded.stranded_in_redis`; one call a lane, no key scan; what a
    lane parked is released whatever it is declared now). Says nothing when Redis fails (the
    runtime says so on its first call).
    """
    from pipeline.topics.stranded import stranded_in_redis  # noqa: PLC0415 - a start-only read

    try:
        lines = await stranded_in_redis(redis, prefix, [lane.spec for lane in lanes], scan=False)
    except FAILED as exc:
        log.debug("could not look for state stranded by a lane's declaration: %s", exc)
        return []
    for line in lines:
        log.warning(line)
    return lines
