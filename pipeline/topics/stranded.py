"""Work that members keep in Redis by lane, which a changed declaration leaves with no reader.

On an ordered lane with retry tiers the followers held behind a parked key wait only in Redis
(their offsets are committed) under ``{P:guard:LANE}``, and a debounced lane's buffered messages
wait under ``{P:deb:LANE}``. A lane still declared releases what it parked, ordered or not now
(:mod:`pipeline.runtime.guard`), but a lane renamed or removed is no longer read at all, and a
lane whose ``debounce`` is removed never turns its buffers again. The broker shows none of it, so
:func:`stranded_in_redis` looks in the members' Redis and gives one line for each such lane.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.admission.debounce.keys import due_key
from pipeline.retry.keys import guard_keys

if TYPE_CHECKING:
    from collections.abc import Sequence

    from redis.asyncio import Redis

    from pipeline.topics.spec import TopicSpec

__all__ = ["stranded_in_redis"]

_SCAN_COUNT = 1000


async def stranded_in_redis(
    redis: Redis, prefix: str, specs: Sequence[TopicSpec], *, scan: bool = True
) -> list[str]:
    """One line for each lane whose held followers or debounce buffers no member will release.

    Args:
        redis: the members' Redis (``PIPELINE_REDIS__URL``).
        prefix: their key prefix (``PIPELINE_REDIS__KEY_PREFIX``).
        specs: the declarations the members run (or are about to).
        scan: also find lanes no declaration names (renamed or removed) by scanning the keys;
            without, only ``specs``' own lanes are asked (one call a lane: a member's start).
    """
    by_lane = {spec.lane: spec for spec in specs}
    if scan:
        guarded, buffered = await _lanes_with(redis, prefix)
    else:  # a declared lane's members release what it parked: only its buffers are asked
        guarded, buffered = set(), set(by_lane)
    lines: list[str] = []
    for lane in sorted(guarded):
        if lane in by_lane:  # its members release what it parked, ordered or not now
            continue
        parked = guard_keys(prefix, lane).parked
        count = int(await redis.hlen(parked))
        if not count:
            continue
        why = "no declaration names the lane now (renamed or removed)"
        fix = f"declare lane {lane!r} again"
        lines.append(
            f"lane {lane!r}: {count} key(s) parked in Redis ({parked}) with followers held "
            f"behind them, but {why}, so no member releases them: {fix} and run its members "
            "until pipeline status shows nothing held, then make the change"
        )
    for lane in sorted(buffered):
        spec = by_lane.get(lane)
        if spec is not None and spec.debounce is not None:
            continue
        due = due_key(prefix, lane)
        count = int(await redis.zcard(due))
        if not count:
            continue
        why = (
            "no declaration names the lane now (renamed or removed)"
            if spec is None
            else "the lane is no longer debounced"
        )
        lines.append(
            f"lane {lane!r}: {count} conversation(s) buffered in Redis ({due}), but {why}, so "
            "no member turns them: declare its debounce again and run its members until the "
            "buffers are empty, then make the change"
        )
    return lines


async def _lanes_with(redis: Redis, prefix: str) -> tuple[set[str], set[str]]:
    """Lanes having a parked-keys index, and lanes having a debounce due set, in one key scan.

    The keys are ``{P:guard:LANE}:parked`` and ``{P:deb:LANE}:due`` (lanes are identifiers: no
    glob characters).
    """
    kinds = ((f"{{{prefix}:guard:", "}:parked"), (f"{{{prefix}:deb:", "}:due"))
    found: tuple[set[str], set[str]] = (set(), set())
    async for raw in redis.scan_iter(match=f"{{{prefix}:*", count=_SCAN_COUNT):
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        for (start, end), lanes in zip(kinds, found, strict=True):
            if name.startswith(start) and name.endswith(end):
                lane = name[len(start) : -len(end)]
                if lane and "}" not in lane:
                    lanes.add(lane)
    return found
