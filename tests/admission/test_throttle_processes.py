"""The throttle across several OS processes: the limit holds, crashes heal, no job is stuck."""

from __future__ import annotations

import asyncio
import random
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
KEYS = ["org:a", "org:b", "sub:a/1", "doc:7"]


def _spawn(
    url: str, ns: str, member: str, seed: int, jobs: int, limit: int, lease_ms: int, keys: list[str]
) -> subprocess.Popen[bytes]:
    args = [url, "pl", ns, member, str(seed), str(jobs), str(limit), str(lease_ms), *keys]
    out = subprocess.PIPE if jobs == 0 else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, str(WORKER), *args], stdout=out)


async def _wait_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        assert time.monotonic() < deadline, "worker did not finish: stuck acquisition?"
        await asyncio.sleep(0.05)
    return proc.returncode


async def test_limit_holds_with_random_crashes(redis_service, unique):
    """Five processes with random multi-key jobs, two of them SIGKILLed, never exceed the limit."""
    client = Redis.from_url(redis_service)
    ns, limit, lease_ms = f"p{unique}", 2, 800
    chk = f"pl:{ns}:chk"
    rng = random.Random(unique)
    survivors = [
        _spawn(redis_service, ns, f"s{i}", rng.randrange(1 << 30), 96, limit, lease_ms, KEYS)
        for i in range(3)
    ]
    victims = {
        f"v{n}": _spawn(
            redis_service, ns, f"v{n}", rng.randrange(1 << 30), 100_000, limit, lease_ms, KEYS
        )
        for n in range(2)
    }
    for member, victim in victims.items():
        threshold = rng.randint(5, 40)
        deadline = time.monotonic() + 30
        while int(await client.get(f"{chk}:ops:{member}") or 0) < threshold:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        victim.kill()
        victim.wait()
        # Its jobs no longer run: take them out of the check sets before their leases lapse.
        for key in KEYS:
            stale = [
                m
                for m in await client.smembers(f"{chk}:{key}")
                if m.decode().startswith(f"{member}/")
            ]
            if stale:
                await client.srem(f"{chk}:{key}", *stale)
    for proc in survivors:
        assert await _wait_exit(proc, 60) == 0
    assert int(await client.get(f"{chk}:violations") or 0) == 0
    for i in range(3):
        assert int(await client.get(f"{chk}:ops:s{i}") or 0) == 96
    # The killed members' permits lapse and every key ends empty.
    probe = Throttle(client, namespace=ns, default_limit=limit, lease_ms=lease_ms)
    await probe.start()
    for key in KEYS:
        permit = await asyncio.wait_for(probe.acquire([key]), 10)
        await probe.release(permit)
        status = await probe.status(key)
        assert status.holders == ()
        assert status.waiters == ()
    await probe.close()
    checks = [key async for key in client.scan_iter(f"{chk}:*")]
    await client.delete(*checks)
    await client.aclose()


async def test_killed_holder_slot_goes_to_waiter_within_lease(redis_service, unique):
    """A kill -9ed holder's slot passes to the waiting member within about one lease."""
    client = Redis.from_url(redis_service)
    ns, lease_ms = f"p{unique}", 600
    holder = _spawn(redis_service, ns, "doomed", 1, 0, 1, lease_ms, ["org:k"])
    assert holder.stdout is not None
    held = (await asyncio.to_thread(holder.stdout.readline)).decode().strip()
    waiter = Throttle(client, namespace=ns, default_limit=1, lease_ms=lease_ms)
    await waiter.start()
    pending = asyncio.create_task(waiter.acquire(["org:k"]))
    await eventually(lambda: waiter.waited == 1, 10)
    assert [h for h, _ in (await waiter.status("org:k")).holders] == [held]
    holder.kill()
    holder.wait()
    holder.stdout.close()
    killed_at = time.monotonic()
    permit = await asyncio.wait_for(pending, 10)
    elapsed_ms = (time.monotonic() - killed_at) * 1000
    # The lease lapses at most lease_ms after the kill; the waiter's heartbeat (every lease/3)
    # finds it. The bound is loose on purpose (a loaded machine), the order is the point.
    assert elapsed_ms < 4 * lease_ms
    assert [h for h, _ in (await waiter.status("org:k")).holders] == [permit.holder]
    await waiter.release(permit)
    await waiter.close()
    await client.aclose()
