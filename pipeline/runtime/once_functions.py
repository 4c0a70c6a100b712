"""Typed wrappers around the ``pipeline_once`` Redis Functions (``lua/once.lua``).

One method per function, with the reply decoded into what it means; the idempotency guard
(:mod:`pipeline.runtime.idempotency`) never calls a function by name.
"""

from __future__ import annotations

from importlib import resources
from typing import Literal

from redis.asyncio import Redis

from pipeline.redis_functions import FunctionLibrary

__all__ = ["Claim", "OnceFunctions", "Record"]

LIBRARY = resources.files("pipeline.runtime").joinpath("lua/once.lua").read_text()
Claim = Literal["claimed", "done", "busy"]
"""What a claim found: it is ours now, the effect already ran, or another holder runs it."""
Record = Literal["done", "running"]
"""What a record holds: the effect ran, or a holder runs it now (no record: neither)."""


class OnceFunctions:
    """The ``pl_once_*`` functions on one client."""

    def __init__(self, client: Redis) -> None:
        """Call the functions through ``client`` (the library loads on first use)."""
        self._client = client
        self._functions = FunctionLibrary(client, LIBRARY)

    async def read(self, key: str) -> Record | None:
        """What the record at ``key`` holds, without claiming it (one ``GET``)."""
        raw = await self._client.get(key)
        if raw is None:
            return None
        return "done" if raw in (b"done", "done") else "running"  # a client may decode it

    async def claim(
        self, key: str, token: str, lease_ms: int, *, ttl_ms: int | None = None
    ) -> Claim:
        """Take the right to run the effect recorded at ``key`` for ``lease_ms``.

        A record found done is kept ``ttl_ms`` again (its expiry left alone if None).
        """
        args = [token, lease_ms] if ttl_ms is None else [token, lease_ms, ttl_ms]
        raw = await self._functions.fcall("pl_once_claim", [key], args)
        state = raw.decode() if isinstance(raw, bytes) else str(raw)
        if state not in ("claimed", "done", "busy"):
            raise ValueError(f"pl_once_claim answered {state!r}")
        return state  # type: ignore[return-value]

    async def settle(self, key: str, token: str, *, done: bool, ttl_ms: int) -> bool:
        """Record the end of ``token``'s run: done (kept ``ttl_ms``) or aborted (forgotten).

        Returns False if the claim had lapsed and passed to another holder.
        """
        outcome, ttl = ("done", ttl_ms) if done else ("abort", 0)
        return bool(await self._functions.fcall("pl_once_settle", [key], [token, outcome, ttl]))

    async def renew(self, key: str, token: str, lease_ms: int) -> bool:
        """Extend ``token``'s claim by ``lease_ms``; False if it is no longer held."""
        return bool(await self._functions.fcall("pl_once_renew", [key], [token, lease_ms]))
