"""Read-only snapshots of throttle keys, for ``pipeline throttle status`` and metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from pipeline.admission import keys as k
from pipeline.admission.shares import applied

MAX_PRIORITY = 1000
_SEQ_SPAN = 10**12  # waiter rank = (MAX_PRIORITY - priority) * _SEQ_SPAN + arrival sequence


@dataclass(frozen=True, slots=True)
class ThrottleStatus:
    """A snapshot of one key: its limit, holders, waiters and recent grants."""

    key: str
    limit: int
    """What admission applies now (a fleet share: at the fleet's factor now)."""
    holders: tuple[tuple[str, int], ...]
    """(holder, lease expiry as Unix ms), soonest expiry first."""
    waiters: tuple[tuple[str, int], ...]
    """(holder, priority) in the order they will be served."""
    recent_grants: tuple[tuple[str, int], ...]
    """(holder, grant time as Unix ms), newest first, at most 20."""
    reserve: tuple[int, int] | None = None
    """(slots, min priority) kept for better priorities (``Throttle.set_reserve``), if any."""
    reserved_asked: int = 0
    """Permits of the reserve's priorities that asked for the key while it kept a reserve."""
    reserved_queued: int = 0
    """Those of them that found no room and queued: ``reserved_queued / reserved_asked`` is the
    measured probability that such a permit waits, which the reserve is sized to bound."""
    closed_until_ms: int | None = None
    """Until when (Unix ms, Redis's clock) a Retry-After closed this adaptive key, if it did.

    Its limit is 0 meanwhile; the first throttle call after that time reopens it (lazily: a time
    already past means no call came since)."""
    reopen_limit: int | None = None
    """The limit a closed key reopens with: its adaptive window, at least 1 slot."""

    def waiters_by_priority(self) -> dict[int, int]:
        """Number of waiters per priority, highest priority first."""
        counts: dict[int, int] = {}
        for _, priority in self.waiters:
            counts[priority] = counts.get(priority, 0) + 1
        return dict(sorted(counts.items(), reverse=True))

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        out: dict[str, Any] = {
            "key": self.key,
            "limit": self.limit,
            "holders": [{"holder": h, "expires_ms": e} for h, e in self.holders],
            "waiters": {str(p): n for p, n in self.waiters_by_priority().items()},
            "recent_grants": [{"holder": h, "at_ms": t} for h, t in self.recent_grants],
        }
        if self.reserve is not None or self.reserved_asked:
            slots, min_priority = self.reserve or (0, 0)
            out["reserve"] = {
                "slots": slots,
                "min_priority": min_priority,
                "asked": self.reserved_asked,
                "queued": self.reserved_queued,
            }
        if self.closed_until_ms is not None:
            out["closed"] = {"until_ms": self.closed_until_ms, "reopen_limit": self.reopen_limit}
        return out


async def read_status(
    client: Redis, prefix: str, namespace: str, key: str, default_limit: int
) -> ThrottleStatus:
    """Read ``key``'s state in one ``MULTI`` transaction (one round trip).

    Its limit is the one admission applies: a fleet share at the fleet's factor now, else the
    limit set; an adaptive key a Retry-After closed has 0, and says until when and what it
    reopens with.
    """
    async with client.pipeline(transaction=True) as pipe:
        pipe.hget(k.limits(prefix, namespace), key)
        pipe.zrange(k.holders(prefix, namespace, key), 0, -1, withscores=True)
        pipe.zrange(k.waiters(prefix, namespace, key), 0, -1, withscores=True)
        pipe.lrange(k.grants(prefix, namespace, key), 0, -1)
        pipe.hget(k.reserve(prefix, namespace), key)
        pipe.hget(k.reserved(prefix, namespace), key)
        pipe.hget(k.reserved_queued(prefix, namespace), key)
        pipe.hget(k.shares(prefix, namespace), key)
        pipe.get(k.fleet_factor(prefix, namespace))
        pipe.zscore(k.closed(prefix, namespace), key)
        pipe.hget(k.aimd(prefix, namespace, key), "limit")
        replies = await pipe.execute()
    limit, holders, waiters, grants, reserve, asked, queued, share, factor, until, window = replies
    closed = until is not None
    return ThrottleStatus(
        key=key,
        limit=applied(limit, share, factor, default_limit),
        holders=tuple((_text(h), int(s)) for h, s in holders),
        waiters=tuple((_text(h), MAX_PRIORITY - int(s) // _SEQ_SPAN) for h, s in waiters),
        recent_grants=tuple(_grant(g) for g in grants),
        reserve=_reserve(reserve),
        reserved_asked=int(asked or 0),
        reserved_queued=int(queued or 0),
        closed_until_ms=int(until) if closed else None,
        reopen_limit=_reopen_limit(window) if closed else None,
    )


def _reopen_limit(window: Any) -> int:
    """The limit the script gives a closed key when it reopens: its window, floored, at least 1."""
    return max(1, math.floor(float(_text(window)))) if window is not None else 1


def _reserve(value: Any) -> tuple[int, int] | None:
    """``"SLOTS:MIN_PRIO"`` as two ints, or None when the key keeps no reserve."""
    if value is None:
        return None
    slots, _, min_priority = _text(value).partition(":")
    return int(slots), int(min_priority)


async def read_active_keys(client: Redis, prefix: str, namespace: str) -> list[str]:
    """Throttle keys of the namespace that have holders or waiters now, sorted."""
    members = await client.smembers(k.active(prefix, namespace))
    return sorted(_text(m) for m in members)


async def read_closed_keys(client: Redis, prefix: str, namespace: str) -> list[str]:
    """Adaptive keys of the namespace a Retry-After closed (not reopened yet), sorted."""
    members = await client.zrange(k.closed(prefix, namespace), 0, -1)
    return sorted(_text(m) for m in members)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _grant(entry: Any) -> tuple[str, int]:
    holder, _, at_ms = _text(entry).partition(" ")
    return holder, int(at_ms or 0)
