"""A member stopped (SIGSTOP) past its lease and then resumed never runs beside the new holders."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually

from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

WORKER = Path(__file__).with_name("throttle_worker.py")


def _spawn_holder(url: str, ns: str, lease_ms: int, key: str) -> subprocess.Popen[bytes]:
    """A member that acquires ``key`` (limit 1), prints its holder id once granted, and waits."""
    args = [url, "pl", ns, "stalled", "1", "0", "1", str(lease_ms), key]
    return subprocess.Popen([sys.executable, str(WORKER), *args], stdout=subprocess.PIPE)


async def test_a_wake_read_after_a_stall_past_the_lease_does_not_run_the_job(redis_service, unique):
    """A wake a stopped member reads only after its permit's lease lapsed queues it again."""
    client = Redis.from_url(redis_service)
    ns, lease_ms = f"p{unique}", 600
    first = Throttle(client, namespace=ns, default_limit=1, lease_ms=lease_ms)
    second = Throttle(client, namespace=ns, default_limit=1, lease_ms=lease_ms)
    await first.start()
    await second.start()
    held = await first.acquire(["org:a"])
    stalled = _spawn_holder(redis_service, ns, lease_ms, "org:a")
    assert stalled.stdout is not None
    try:
        waiters: tuple[tuple[str, int], ...] = ()
        deadline = time.monotonic() + 20
        while len(waiters) < 1:
            assert time.monotonic() < deadline, "the worker never queued"
            waiters = (await first.status("org:a")).waiters
        stalled_holder = waiters[0][0]
        os.kill(stalled.pid, signal.SIGSTOP)
        pending = asyncio.create_task(second.acquire(["org:a"]))
        await eventually(lambda: second.waited == 1, 10)
        # The slot goes to the stopped member's waiter (a wake it cannot read yet); its lease
        # lapses, and the second member's heartbeat hands the slot on.
        await first.release(held)
        permit = await asyncio.wait_for(pending, 10)
        assert [h for h, _ in (await second.status("org:a")).holders] == [permit.holder]
        os.kill(stalled.pid, signal.SIGCONT)
        # Resumed, the member must not take the stale wake for a grant: its permit is gone, so
        # it queues again (same holder) behind the second member's job.
        deadline = time.monotonic() + 20
        while True:
            assert time.monotonic() < deadline, "the resumed member neither ran nor queued"
            ran, _, _ = select.select([stalled.stdout], [], [], 0)
            assert not ran, "the resumed member ran its job beside the slot's new holder"
            status = await second.status("org:a")
            if [h for h, _ in status.waiters] == [stalled_holder]:
                break
            await asyncio.sleep(0.02)
        assert [h for h, _ in status.holders] == [permit.holder]
        await second.release(permit)
        line = await asyncio.wait_for(asyncio.to_thread(stalled.stdout.readline), 10)
        assert line.decode().strip() == stalled_holder
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
        stalled.kill()
        stalled.wait()
        stalled.stdout.close()
        await first.close()
        await second.close()
        await client.aclose()
