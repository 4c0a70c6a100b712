"""Typed wrapper around the ``pipeline_guard_rename`` Redis Function (``lua/rename.lua``).

One method, with the reply decoded into what it means; :mod:`pipeline.retry.rename_long_keys`
never calls the function by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Literal

from redis.asyncio import Redis

from pipeline.redis_functions import FunctionLibrary
from pipeline.retry.keys import GuardKeys

__all__ = ["Moved", "RenameFunctions"]

LIBRARY = resources.files("pipeline.retry").joinpath("lua/rename.lua").read_text()
Moved = Literal["moved", "gone", "both"]
"""What a move found: moved to the current name; the earlier name no longer parked (another
member moved it, or it was released); both names parked (left as they are)."""

_CODES: dict[int, Moved] = {1: "moved", 0: "gone", 2: "both"}


class RenameFunctions:
    """The ``gd_rename`` function on one client."""

    def __init__(self, client: Redis) -> None:
        """Call the function through ``client`` (the library loads on first use)."""
        self._functions = FunctionLibrary(client, LIBRARY)

    async def rename(self, keys: GuardKeys, pairs: Sequence[tuple[str, str]]) -> list[Moved]:
        """Move each parked key of ``keys``' lane from its earlier name to its current one.

        ``pairs``: (earlier name, current name). One call, atomic; one answer per pair.
        """
        flat = [name for pair in pairs for name in pair]
        reply = await self._functions.fcall(
            "gd_rename", [keys.parked, keys.releases], [keys.tag, *flat]
        )
        return [_CODES[int(code)] for code in reply]
