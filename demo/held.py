"""The accepted events a run's ordered lanes hold in Redis behind a parked key.

On an ordered lane with retry tiers, a message whose key has an earlier message waiting in a
retry tier (parked) is held behind it: its offset is committed and its only copy is a field of
the key's held-followers hash (``{P:guard:LANE}:f:KEY``, :mod:`pipeline.retry.keys`) until the
earlier one finishes. At the end of a short run the messages lane's heads may wait in its 1 min
or 10 min tier, so their followers are in no topic: the audit (:mod:`.audit`) counts them as
waiting, not lost, from their ``pl-row-id`` header.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from redis.asyncio import Redis

from pipeline import headers as h
from pipeline.retry.held import decode_held
from pipeline.retry.keys import guard_keys

log = logging.getLogger(__name__)


def held_pattern(prefix: str, lane: str) -> str:
    """``SCAN MATCH`` pattern of the held-followers hashes of ``lane`` under ``prefix``."""
    return f"{guard_keys(prefix, lane).tag}:f:*"


async def held_rows(redis: Redis, prefix: str, lanes: Iterable[str]) -> set[str]:
    """Log row ids (``pl-row-id``) of the followers ``lanes`` hold behind parked keys.

    A held message that cannot be decoded is one warning line (it is then counted nowhere, so
    as lost, rather than guessed at).
    """
    rows: set[str] = set()
    for lane in lanes:
        async for key in redis.scan_iter(match=held_pattern(prefix, lane), count=1_000):
            for field, value in (await redis.hgetall(key)).items():
                try:
                    message = decode_held(value if isinstance(value, bytes) else value.encode())
                except (ValueError, KeyError) as exc:
                    log.warning(
                        "could not decode held follower %r of %s (%s): the audit counts it as"
                        " lost; look at it with redis-cli HGET",
                        field,
                        key,
                        exc,
                    )
                    continue
                if (row := message.headers.get(h.ROW_ID)) is not None:
                    rows.add(row.decode())
    return rows
