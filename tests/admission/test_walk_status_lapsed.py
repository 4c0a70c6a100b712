"""`pipeline throttle status` tells holders whose lease lapsed from live ones."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
from redis.asyncio import Redis

from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis


async def _status(env: dict[str, str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pipeline",
        "throttle",
        "status",
        "org:acme",
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    return out.decode()


async def test_a_dead_members_holders_are_shown_lapsed_until_reaped(
    redis_service: str, unique: str
) -> None:
    """A member killed holding slots showed as holding them until some member called again.

    Expiry is lazy: with no member calling (the only one was killed), status printed
    ``holders 1`` for as long as nobody called, the lease long gone, with nothing to say the
    slot was free to the next call.
    """
    ns = f"w{unique}"
    env = {"PIPELINE_REDIS__URL": redis_service, "PIPELINE_THROTTLE__NAMESPACE": ns}
    client = Redis.from_url(redis_service)
    dead = Throttle(client, namespace=ns, default_limit=1, lease_ms=300)
    await dead.start()
    try:
        await dead.acquire(["org:acme"])
        await dead.close()  # its heartbeat stops as a kill -9 stops it
        await asyncio.sleep(0.6)  # two leases pass with nobody calling
        out = await _status(env)
        assert "1 (1 lapsed)" in out, out
    finally:
        await dead.close()
        live = Throttle(client, namespace=ns, default_limit=1, lease_ms=300)
        permit = await live.try_acquire(["org:acme"])  # reaps the lapsed one
        assert permit is not None
        await live.release(permit)
        await client.aclose()
