"""Waiting permits a stalled member lets lapse: one log line, queued again, every job runs."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually

from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

WAITERS = 40


async def test_waiters_lapsed_by_a_stall_are_one_line_and_all_run(
    redis_service: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A member whose loop stalls past its waiters' lease says so once, not once a permit.

    A flood left a member with a thousand waiting permits; a stall past their lease made the
    next heartbeat print 1,045 warning lines in two seconds, one per permit, none saying why.
    """
    client = Redis.from_url(redis_service)
    ns = f"w{unique}"
    holder = Throttle(client, namespace=ns, default_limit=1, lease_ms=60_000)
    stalled = Throttle(client, namespace=ns, default_limit=1, lease_ms=600)
    await holder.start()
    await stalled.start()
    try:
        held = await holder.acquire(["org:a"])

        async def job() -> None:
            permit = await stalled.acquire(["org:a"])
            await stalled.release(permit)

        jobs = [asyncio.create_task(job()) for _ in range(WAITERS)]
        await eventually(lambda: stalled.waited == WAITERS, 20)
        caplog.set_level(logging.WARNING, logger="pipeline.admission.throttle")
        # The member's event loop stalls for three leases (a GC pause, a paused VM).
        time.sleep(2.0)  # noqa: ASYNC251
        await eventually(lambda: stalled.lost >= WAITERS, 20)
        lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.admission.throttle"]
        lapsed = [line for line in lines if "lapsed" in line]
        # One line a heartbeat, counting its lapsed waiters (a loaded host may lapse a few of
        # them once more after they were queued again: another line, not another 40).
        assert 1 <= len(lapsed) <= 3, lines
        counts = [int(re.search(r": (\d+) waiting permit\(s\)", line)[1]) for line in lapsed]  # type: ignore[index]
        assert sum(counts) == stalled.lost
        assert all("lease 600 ms" in line for line in lapsed)
        await holder.release(held)
        await asyncio.wait_for(asyncio.gather(*jobs), 30)
        status = await holder.status("org:a")
        assert status.holders == ()
        assert status.waiters == ()
    finally:
        await stalled.close()
        await holder.close()
        await client.aclose()
