"""A member process for the throttle tests: random multi-key jobs, checked against the limit.

Usage: python throttle_worker.py URL PREFIX NAMESPACE MEMBER SEED JOBS LIMIT LEASE_MS KEYS...

Each job acquires a random subset of KEYS, adds itself to the check set ``chk:KEY`` of each key
(and counts a violation if a set then holds more than LIMIT), works a moment, leaves the sets and
releases. ``ops:MEMBER`` counts finished jobs, so the parent can wait for progress before killing
this process. With JOBS = 0 it holds every key once and then waits forever (to be killed).
"""

from __future__ import annotations

import asyncio
import random
import sys

from redis.asyncio import Redis

from pipeline.admission.throttle import Throttle


async def main(argv: list[str]) -> None:
    """Run the jobs of one member."""
    url, prefix, namespace, member, seed, jobs, limit, lease_ms, *keys = argv
    client = Redis.from_url(url)
    throttle = Throttle(
        client,
        prefix=prefix,
        namespace=namespace,
        default_limit=int(limit),
        lease_ms=int(lease_ms),
        member=member,
    )
    await throttle.start()
    chk = f"{prefix}:{namespace}:chk"
    if int(jobs) == 0:
        permit = await throttle.acquire(keys)
        print(permit.holder, flush=True)  # noqa: T201 - the parent reads the holder id
        await asyncio.Event().wait()
    rng = random.Random(int(seed))
    per_task = int(jobs) // 8

    async def run() -> None:
        for _ in range(per_task):
            mine = rng.sample(keys, rng.randint(1, min(3, len(keys))))
            permit = await throttle.acquire(mine, priority=rng.randint(0, 3))
            tag = f"{member}/{permit.holder}"
            async with client.pipeline(transaction=True) as pipe:
                for key in permit.keys:
                    pipe.sadd(f"{chk}:{key}", tag)
                    pipe.scard(f"{chk}:{key}")
                counts = (await pipe.execute())[1::2]
            if max(counts) > int(limit):
                await client.incr(f"{chk}:violations")
            await asyncio.sleep(rng.random() * 0.003)  # simulated work
            async with client.pipeline(transaction=True) as pipe:
                for key in permit.keys:
                    pipe.srem(f"{chk}:{key}", tag)
                await pipe.execute()
            await throttle.release(permit)
            await client.incr(f"{chk}:ops:{member}")

    await asyncio.gather(*(run() for _ in range(8)))
    await throttle.close()
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
