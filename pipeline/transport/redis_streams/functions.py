"""The Redis Functions library ``lua/streams.lua`` and typed wrappers around its functions.

The library is loaded once per client under its versioned name (``pipeline.redis_functions``);
a call that finds it missing (a Redis that lost its data, or ``FUNCTION FLUSH``) reloads it and
retries once.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from pipeline.redis_channel import channel_of
from pipeline.redis_functions import FunctionLibrary, is_missing

LIBRARY = (
    resources.files("pipeline.transport.redis_streams").joinpath("lua/streams.lua").read_text()
)


class Functions(FunctionLibrary):
    """Calls into the ``pipeline_streams`` library for one Redis client."""

    def __init__(self, client: Redis) -> None:
        """Bind to ``client``; the library is loaded on first use."""
        super().__init__(client, LIBRARY)

    async def produce_batch(
        self, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Run several ``pl_produce`` calls in one pipeline, in order; errors come back in place.

        Through the client's function channel when one is bound (the transport binds one to a
        plain TCP client), else through a redis-py pipeline.

        If the library is missing, no call in the batch ran (each fails the same way), so the
        whole batch is retried once after reloading, keeping produce order.
        """
        await self.ensure_loaded()
        channel = channel_of(self.client)
        for attempt in (1, 2):
            results: list[Any]
            if channel is not None:  # one write, replies parsed by hiredis (no pool, no pipeline)
                results = await channel.fcall_many(self.name("pl_produce"), calls)
            else:
                pipe: Pipeline = self.client.pipeline(transaction=False)
                for keys, args in calls:
                    pipe.fcall(self.name("pl_produce"), len(keys), *keys, *args)
                results = await pipe.execute(raise_on_error=False)
            if attempt == 1 and results and all(is_missing(r) for r in results):
                await self.load()
                continue
            return results
        return results  # pragma: no cover - loop always returns

    async def heartbeat(
        self, members: str, owners: str, member: str, lease_ms: int, partitions: Sequence[str]
    ) -> tuple[list[str], list[str]]:
        """Renew this member's lease; returns (owned partition ids, ids to release)."""
        owned, release = await self.fcall(
            "pl_heartbeat", [members, owners], [member, lease_ms, *partitions]
        )
        return [_text(p) for p in owned], [_text(p) for p in release]

    async def commit(
        self, owners: str, positions: str, member: str, committed: Sequence[tuple[str, int, str]]
    ) -> list[str]:
        """Record (partition id, position, metadata) where this member holds the lease.

        Returns the partition ids whose lease is another member's: left as they were.
        """
        args: list[object] = [member]
        for pid, offset, metadata in committed:
            args += [pid, offset, metadata]
        refused = await self.fcall("pl_commit", [owners, positions], args)
        return [_text(p) for p in refused]

    async def release(
        self, members: str, owners: str, member: str, partitions: Sequence[str], *, leave: bool
    ) -> int:
        """Release partitions this member owns; ``leave`` also removes it from the group."""
        released = await self.fcall(
            "pl_release", [members, owners], [member, "1" if leave else "0", *partitions]
        )
        return int(released)

    async def forget_consumers(self, stream: str, group: str, member: str) -> int:
        """Delete ``group``'s consumers of ``stream`` other than ``member`` with nothing pending.

        Called by the partition's owner once it has claimed every pending entry of the former
        owners; returns how many consumers were deleted.
        """
        return int(await self.fcall("pl_forget_consumers", [stream], [group, member]))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
