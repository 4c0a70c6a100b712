"""Typed wrappers around the ``pipeline_lane_lease`` Redis Functions (``lua/lane_lease.lua``).

One method per function, with the reply decoded into what it means; the lane lease
(:mod:`pipeline.runtime.lane_lease`) never calls a function by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Literal

from redis.asyncio import Redis

from pipeline.redis_functions import FunctionLibrary

__all__ = ["Holder", "LaneLeaseFunctions", "Left"]

LIBRARY = resources.files("pipeline.runtime").joinpath("lua/lane_lease.lua").read_text()
Left = Literal["free", "kept", "other"]
"""What leaving found: the lane is free now, another live member of the group still holds it,
or the lease names another group (or none) and was left alone."""


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a lane's lease, as one hold found it (times on the Redis's clock, in ms)."""

    ours: bool
    """The caller's group holds it (taken or renewed just now)."""
    group: str
    at_ms: int
    """When a member of ``group`` last renewed it."""
    lease_ms: int
    """How long after that renewal it ends, unless renewed again."""
    now_ms: int

    @property
    def age_s(self) -> float:
        """Seconds since its last renewal."""
        return max(0, self.now_ms - self.at_ms) / 1000


def _text(raw: object) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


class LaneLeaseFunctions:
    """The ``pl_lane_*`` functions on one client."""

    def __init__(self, client: Redis) -> None:
        """Call the functions through ``client`` (the library loads on first use)."""
        self._functions = FunctionLibrary(client, LIBRARY)

    async def hold(self, key: str, group: str, token: str, lease_ms: int) -> Holder:
        """Take the lease at ``key`` for ``group`` (member ``token``), or renew it.

        A lease of another group is left alone: the reply names it.
        """
        raw = await self._functions.fcall("pl_lane_hold", [key], [group, token, lease_ms])
        ours, holder, at_ms, held_ms, now_ms = raw
        return Holder(bool(int(ours)), _text(holder), int(at_ms), int(held_ms), int(now_ms))

    async def leave(self, key: str, group: str, token: str) -> Left:
        """Member ``token`` of ``group`` stops holding the lease at ``key``."""
        answer = int(await self._functions.fcall("pl_lane_leave", [key], [group, token]))
        return "free" if answer == 1 else "kept" if answer == 0 else "other"
