"""Held permits a stalled member lets lapse are one log line a heartbeat, not one each."""

from __future__ import annotations

import logging
import time

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually

from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

HELD = 20


async def test_held_permits_lapsed_by_a_stall_are_one_line(
    redis_service: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A member running 20 jobs that stalled past their lease printed 20 warning lines."""
    client = Redis.from_url(redis_service)
    stalled = Throttle(client, namespace=f"w{unique}", default_limit=HELD, lease_ms=600)
    await stalled.start()
    try:
        permits = [await stalled.acquire(["org:a"]) for _ in range(HELD)]
        caplog.set_level(logging.WARNING, logger="pipeline.admission.throttle")
        # The member's event loop stalls for three leases (a GC pause, a paused VM).
        time.sleep(2.0)  # noqa: ASYNC251
        await eventually(lambda: stalled.lost >= HELD, 20)
        lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.admission.throttle"]
        assert len(lines) == 1, lines
        assert f"{HELD} held permit(s)" in lines[0]
        assert "lease 600 ms" in lines[0]
        for permit in permits:
            await stalled.release(permit)  # a harmless no-op each
        assert (await stalled.status("org:a")).holders == ()
    finally:
        await stalled.close()
        await client.aclose()
