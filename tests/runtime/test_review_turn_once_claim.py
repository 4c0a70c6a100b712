"""A turn's ``ctx.once`` that fails reading its earlier name leaves no claim of its own.

The claim of the turn's own record is taken before the record under the earlier name (the
turn's last message) is read; when that read fails (here a record Redis cannot ``GET``: a
``WRONGTYPE`` error, as a dropped connection would fail it), the claim was left for a lease,
so the turn's retry waited it out and raised ``Retry`` instead of running the effect.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from pipeline.runtime.idempotency import IdempotencyGuard
from pipeline.runtime.keys import once_key


async def test_a_failed_read_of_the_earlier_name_releases_the_claim(
    redis: Redis, unique: str
) -> None:
    """The read fails: the turn's own record is left unclaimed, and the next call runs it."""
    prefix = f"t{unique}"
    guard = IdempotencyGuard(redis, prefix, lease_ms=60_000)
    earlier = once_key(prefix, "lane", "topic:0:1", "reply")
    own = once_key(prefix, "lane", "turn:abc", "reply")
    runs: list[str] = []

    async def reply() -> None:
        runs.append("ran")

    try:
        await redis.hset(earlier, "not", "a record")
        with pytest.raises(ResponseError):
            await guard.once("lane", "turn:abc", "reply", reply, also_done="topic:0:1")
        assert await redis.get(own) is None, "the failed call left its claim"
        await redis.delete(earlier)
        await guard.once("lane", "turn:abc", "reply", reply, also_done="topic:0:1")
        assert runs == ["ran"]
    finally:
        await redis.delete(earlier, own)
