"""Say at ``pipeline consume`` start when the member's Redis persists nothing at all.

A follower held behind a parked key (an ordered lane with retry tiers) and a message waiting in
a debounce buffer have their offsets committed: Redis keeps their only copy. A Redis with
neither an append-only file (``appendonly no``) nor snapshots (``save ""``) starts empty after
every restart, so a restart loses them all, silently. The member reads the two settings once
(``CONFIG GET``) and logs one warning line when its lanes keep such messages; a managed Redis
that refuses ``CONFIG`` (or a Redis out of reach) makes it say nothing, as
:func:`pipeline.runtime.eviction.warn_if_evicting` does. A Redis that snapshots only is not
named: it loses what changed since its last snapshot, not everything (the member's watch,
:mod:`pipeline.runtime.state_loss`, reports such a loss when it happens).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from redis.asyncio import Redis

from pipeline.reachability import safe_url
from pipeline.redis_functions import FAILED
from pipeline.runtime.app import Lane
from pipeline.runtime.eviction import config_value, kept_only_in_redis

log = logging.getLogger(__name__)


async def warn_if_not_persisting(redis: Redis, url: str, lanes: Sequence[Lane]) -> str | None:
    """Log one warning if the Redis at ``url`` persists nothing ``lanes`` keep only there.

    Reads ``appendonly`` and ``save`` (``CONFIG GET``): a warning when the first is ``no`` and
    the second empty, and ``lanes`` hold followers or buffer messages. Returns the line, or
    None. Says nothing when the Redis refuses ``CONFIG`` or cannot be reached (the runtime says
    so on its first call).
    """
    kept = kept_only_in_redis(lanes)
    if not kept:
        return None
    try:
        appendonly = config_value(await redis.config_get("appendonly"), "yes")
        save = config_value(await redis.config_get("save"), "?")
    except FAILED as exc:
        log.debug("could not read the persistence of Redis %s: %s", safe_url(url), exc)
        return None
    if appendonly != "no" or save.strip():
        return None
    line = (
        f'Redis {safe_url(url)} persists nothing (appendonly no, save ""): a restart '
        f"empties it, losing the {' and '.join(kept)}, whose offsets are committed "
        "(Redis holds their only copy); set appendonly yes and appendfsync everysec"
    )
    log.warning(line)
    return line
