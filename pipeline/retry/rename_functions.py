"""Typed wrapper around the ``pipeline_guard_rename`` Redis Function (``lua/rename.lua``).

Its two functions, with the reply decoded into what it means; :mod:`pipeline.retry.rename_long_keys`
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
Moved = Literal["moved", "gone", "both", "busy", "unnamed"]
"""What a move found: moved to the other name; the name no longer parked (another member moved
it, or it was released); both names parked (left as they are); a release of the key in
progress (left as it is for now); its other name not kept (``rename_back`` only)."""

_CODES: dict[int, Moved] = {1: "moved", 0: "gone", 2: "both", 3: "busy", 4: "unnamed"}


class RenameFunctions:
    """The ``gd_rename`` and ``gd_rename_back`` functions on one client."""

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

    async def rename_back(self, keys: GuardKeys, names: Sequence[str]) -> list[Moved]:
        """Move each parked key of ``keys``' lane named ``names`` to the other name it keeps.

        The other name is its ``alias`` in ``T:h`` (``lua/guard.lua``). One call, atomic; one
        answer per name.
        """
        reply = await self._functions.fcall(
            "gd_rename_back", [keys.parked, keys.releases], [keys.tag, *names]
        )
        return [_CODES[int(code)] for code in reply]
