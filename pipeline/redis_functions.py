"""Load a Redis Functions library once and call its functions, reloading it if Redis lost it.

Each ``.lua`` library file lives beside the Python that owns it and starts with
``#!lua name=<library>``; it is loaded with ``FUNCTION LOAD REPLACE`` on first use. A call that
finds the function missing (a Redis restarted without persistence, or ``FUNCTION FLUSH``)
reloads the library and retries once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import exceptions as rexc
from redis.asyncio import Redis


def is_missing(error: BaseException) -> bool:
    """True if ``error`` says the called function is not loaded."""
    return isinstance(error, rexc.ResponseError) and "Function not found" in str(error)


class FunctionLibrary:
    """One Lua library on one Redis client."""

    def __init__(self, client: Redis, source: str) -> None:
        """Bind ``source`` (the library's code) to ``client``; loading waits for first use."""
        self.client = client
        self._source = source
        self._loaded = False

    async def load(self) -> None:
        """``FUNCTION LOAD REPLACE`` the library."""
        await self.client.function_load(self._source, replace=True)
        self._loaded = True

    async def ensure_loaded(self) -> None:
        """Load the library unless this process already did."""
        if not self._loaded:
            await self.load()

    async def fcall(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """``FCALL name`` with ``keys`` and ``args``, reloading the library once if needed."""
        await self.ensure_loaded()
        try:
            return await self.client.fcall(name, len(keys), *keys, *args)
        except rexc.ResponseError as exc:
            if not is_missing(exc):
                raise
            await self.load()
            return await self.client.fcall(name, len(keys), *keys, *args)
