"""The Redis Functions library ``lua/limits.lua`` and typed wrappers around its functions.

A fleet tick writes and reads the per-org stats of every org seen. As pipelined commands (up
to five an org, each packed and its reply parsed by redis-py) that took some 65 µs an org of
the tick, and 50,000 orgs took longer than the 10 s interval; one call per batch of orgs takes
about a fifth of that. The Lua header says what each function does; the library is loaded once
per client under its versioned name (:mod:`pipeline.redis_functions`) and reloaded if Redis
lost it.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.asyncio import Redis

from pipeline.redis_functions import FunctionLibrary

LIBRARY = resources.files("pipeline.admission").joinpath("lua/limits.lua").read_text()


class LimitFunctions(FunctionLibrary):
    """Calls into the ``pipeline_limits`` library on one Redis client."""

    def __init__(self, client: Redis) -> None:
        """Bind to ``client``; the library is loaded at the first call."""
        super().__init__(client, LIBRARY)

    async def record(
        self,
        keys: Sequence[str],
        fields: tuple[str, str, str],
        ttl_ms: int,
        gone: Sequence[str],
        counts: Sequence[tuple[int, int, Any]],
    ) -> int:
        """``lim_record``: add ``counts`` (submitted, finished, their durations summed) per key.

        ``fields`` are this minute's n, c and d fields; ``gone`` the stale fields, deleted from
        each key that holds them; each key expires ``ttl_ms`` from now. Returns the number of
        keys written.
        """
        args: list[Any] = [*fields, ttl_ms, len(gone), *gone]
        for submitted, finished, seconds in counts:
            args += [submitted, finished, seconds]
        return int(await self.fcall("lim_record", keys, args))

    async def read(self, keys: Sequence[str]) -> list[dict[Any, Any]]:
        """``lim_read``: each key's fields and values, in the order ``HGETALL`` gives them."""
        replies = await self.fcall("lim_read", keys, [])
        return [dict(zip(flat[::2], flat[1::2], strict=True)) for flat in replies]
