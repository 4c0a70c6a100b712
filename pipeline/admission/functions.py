"""The Redis Functions library ``lua/throttle.lua`` and typed wrappers around its functions.

One :class:`ThrottleFunctions` per (namespace, Redis client): every function takes the
namespace's ``T:meta`` key (from :mod:`pipeline.admission.keys`) as ``KEYS[1]`` and derives the
rest from its hash tag; ``KEYS[2]``, ``T:slot_guard``, is never written, so Redis Cluster refuses
a call (``TRYAGAIN``) while the namespace's slot migrates rather than run it on part of its keys.
The Lua header says what each does. Each reply comes back typed, with the caller's own permits
that the call completed (``woken``: ``"HOLDER GRANT_MS"`` entries).
The library is loaded once per client under its versioned name (:mod:`pipeline.redis_functions`)
and reloaded if Redis lost it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.asyncio import Redis

from pipeline.admission import keys
from pipeline.redis_functions import FunctionLibrary

LIBRARY = resources.files("pipeline.admission").joinpath("lua/throttle.lua").read_text()


@dataclass(frozen=True, slots=True)
class Acquired:
    """The reply of ``thr_acquire``: granted | waiting | busy, keys held, own permits woken."""

    state: str
    held: int
    woken: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Counted:
    """A count and the caller's own permits woken.

    The count is the slots freed (``thr_release``) or the waiters completed (``thr_set_limit``,
    ``thr_set_reserve``).
    """

    count: int
    woken: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Renewed:
    """The reply of ``thr_renew``: one letter per holder (g granted, w waiting, x unknown)."""

    letters: str
    woken: tuple[Any, ...]


class ThrottleFunctions(FunctionLibrary):
    """Calls into the ``pipeline_throttle`` library for one namespace on one Redis client."""

    def __init__(
        self, client: Redis, prefix: str, namespace: str, *, member: str, default_limit: int
    ) -> None:
        """Bind to ``client``, the namespace's keys, the calling member and the default limit."""
        super().__init__(client, LIBRARY)
        self.meta = keys.meta(prefix, namespace)
        self.declared = [self.meta, keys.slot_guard(prefix, namespace)]
        self.member = member
        self.default_limit = default_limit

    async def acquire(
        self,
        holder: str,
        priority: int,
        lease_ms: int,
        wanted: Sequence[str],
        *,
        try_only: bool,
    ) -> Acquired:
        """``thr_acquire``: take ``wanted`` (in canonical order) while they have room, or queue."""
        args = [
            holder,
            self.member,
            priority,
            lease_ms,
            self.default_limit,
            "1" if try_only else "0",
            *wanted,
        ]
        state, held, woken = await self.fcall("thr_acquire", self.declared, args)
        return Acquired(_text(state), int(held), tuple(woken))

    async def release(self, holder: str, feedback: Sequence[str | int | float] = ()) -> Counted:
        """``thr_release``: give up a permit (held or waiting), applying adaptive feedback first."""
        args = [holder, self.default_limit, self.member, *feedback]
        freed, woken = await self.fcall("thr_release", self.declared, args)
        return Counted(int(freed), tuple(woken))

    async def renew(self, holders: Sequence[str] = ()) -> Renewed:
        """``thr_renew``: extend the leases of ``holders`` (none: only expire and reopen)."""
        args = [self.default_limit, self.member, *holders]
        letters, woken = await self.fcall("thr_renew", self.declared, args)
        return Renewed(_text(letters), tuple(woken))

    async def set_limit(self, key: str, limit: int | None) -> Counted:
        """``thr_set_limit``: set (None: clear) ``key``'s limit; new room goes to its waiters."""
        value = "" if limit is None else limit
        args = [key, value, self.default_limit, self.member]
        count, woken = await self.fcall("thr_set_limit", self.declared, args)
        return Counted(int(count), tuple(woken))

    async def set_limits(self, limits: Sequence[tuple[str, int | None]]) -> Counted:
        """``thr_set_limits``: :meth:`set_limit` for each (key, limit) pair, in one call."""
        args: list[str | int] = [self.default_limit, self.member]
        for key, limit in limits:
            args += [key, "" if limit is None else limit]
        count, woken = await self.fcall("thr_set_limits", self.declared, args)
        return Counted(int(count), tuple(woken))

    async def set_shares(self, shares: Sequence[tuple[str, int, str]]) -> Counted:
        """``thr_set_shares``: set each (key, limit, encoded share); new room goes to waiters."""
        args: list[str | int] = [self.default_limit, self.member]
        for key, limit, share in shares:
            args += [key, limit, share]
        count, woken = await self.fcall("thr_set_shares", self.declared, args)
        return Counted(int(count), tuple(woken))

    async def prune_shares(self) -> int:
        """``thr_prune_shares``: drop a bounded step of shares left without a limit; how many."""
        return int(await self.fcall("thr_prune_shares", self.declared, []))

    async def set_reserve(self, key: str, slots: int | None, min_priority: int) -> Counted:
        """``thr_set_reserve``: keep ``slots`` of ``key`` (None: none) for ``min_priority`` up.

        Room that a smaller reserve frees goes to the waiters.
        """
        value = "" if slots is None else slots
        args = [key, value, min_priority, self.default_limit, self.member]
        count, woken = await self.fcall("thr_set_reserve", self.declared, args)
        return Counted(int(count), tuple(woken))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
