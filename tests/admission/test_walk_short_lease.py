"""A permit whose lease is shorter than the throttle's default is renewed in time."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis


async def test_a_lane_lease_shorter_than_the_default_is_renewed_while_idle_before(
    redis_service: str, unique: str
) -> None:
    """An idle member's heartbeat slept a third of the default lease (10 s of 30 s).

    A lane's permits (``throttle.lease: 3s``) acquired meanwhile were not renewed until it woke:
    a fresh member lost every slot it held after 3 s, and its keys were handed to other jobs
    beside those still running (10 ``lost held permit`` lines at its first heartbeat).
    """
    client = Redis.from_url(redis_service)
    ns = f"w{unique}"
    member = Throttle(client, namespace=ns, default_limit=1, lease_ms=30_000)
    other = Throttle(client, namespace=ns, default_limit=1, lease_ms=30_000)
    await member.start()
    await other.start()
    try:
        held = await member.acquire(["org:a"], lease_ms=600)
        for _ in range(5):  # five leases' time: each try also expires lapsed leases
            await asyncio.sleep(0.6)
            assert await other.try_acquire(["org:a"]) is None
        assert member.lost == 0
        await member.release(held)
    finally:
        await other.close()
        await member.close()
        await client.aclose()
