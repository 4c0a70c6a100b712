"""Many one-message tenants, and tenant ids built to break key names, on a real Redis.

What a tenant leaves in Redis once its last job is done is counted, never timed: the throttle's
state must shrink back with the work, however many distinct tenants came and went.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually
from support import started_throttle

from pipeline.admission import keys as k
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis

TENANTS = 300


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle on a namespace of its own (its keys are deleted after the test)."""
    async with started_throttle(redis_service, namespace=f"h{unique}", default_limit=2) as limiter:
        yield limiter


async def _namespace_keys(t: Throttle) -> list[bytes]:
    pattern = k.tag(t.prefix, t.namespace).replace("{", "\\{").replace("}", "\\}") + ":*"
    return [key async for key in t.client.scan_iter(match=pattern, count=1000)]


async def test_tenants_that_came_and_went_leave_no_key_behind(throttle) -> None:
    """300 tenants with one job each, all done: only the namespace's anchor keys stay.

    Each key's grant history lived an hour after its last grant, about 350 bytes a key: a
    million one-message tenants (or per-document keys) held some 350 MB of Redis for an hour
    with nothing held or waiting.
    """
    t = throttle
    busy = await t.acquire(["pool"])  # a key still in use keeps its history

    calls = asyncio.Semaphore(20)  # fewer calls at once than the client has connections

    async def one(i: int) -> None:
        async with calls, t.hold([f"org:tenant-{i}", "pool"]):
            pass

    await asyncio.gather(*(one(i) for i in range(TENANTS)))
    left = {key.split(b"}:", 1)[1] for key in await _namespace_keys(t)}
    kept = {b"meta", b"leases", b"active", b"p:" + busy.holder.encode(), b"h:pool", b"g:pool"}
    assert left <= kept, sorted(left - kept)[:5]
    assert len((await t.status("pool")).recent_grants) == 20  # still held: capped, kept
    await t.release(busy)
    left = {key.split(b"}:", 1)[1] for key in await _namespace_keys(t)}
    assert left <= {b"meta"}, sorted(left)[:5]


@pytest.mark.parametrize(
    "tenant",
    ["", "x" * 10_240, "{a}", "a}b{c", "a:b", "*", "org:*", "\udcff\udcfe", "\ud800"],
    ids=["empty", "10kb", "braces", "inverted-braces", "colon", "star", "glob", "bytes", "lone"],
)
async def test_a_hostile_tenant_id_is_throttled_alone_and_leaves_nothing(throttle, tenant) -> None:
    """A tenant id with braces, colons, globs, 10 KB or no UTF-8 form gets its own key.

    Its limit holds for it alone, a neighbour whose id it could be confused with is not
    touched, and once its jobs are done nothing of it stays.
    """
    t = throttle
    key = f"org:{tenant}"
    await t.set_limit(key, 1)
    held = await t.acquire([key, "pool"])
    assert await t.try_acquire([key]) is None  # its limit of 1 holds
    neighbour = await t.try_acquire(["org:a", "org:b"])
    assert neighbour is not None  # nobody else's key was taken
    await t.release(neighbour)
    status = await t.status(key)
    assert [h for h, _ in status.holders] == [held.holder]
    await t.release(held)
    await t.set_limit(key, None)
    left = {key.split(b"}:", 1)[1] for key in await _namespace_keys(t)}
    assert left <= {b"meta"}, sorted(left)[:5]


async def test_a_burst_of_tenants_beyond_the_clients_connections_is_still_throttled(
    redis_service: str, unique: str
) -> None:
    """More acquisitions at once than the client has connections wait for one, not fail open.

    A member whose Redis client has no function channel (TLS, a Unix socket) sends its calls
    through redis-py's pool, which refuses a call past its ``max_connections`` (100 by default)
    with a ``ConnectionError``, "Too many connections". The throttle took that as Redis being
    down and admitted the job unconditionally: 300 one-message tenants polled at once ran 200
    at a time on a pool key limited to 4.
    """
    client = Redis.from_url(redis_service, max_connections=10)
    t = Throttle(client, namespace=f"b{unique}", default_limit=2)
    await t.start()
    try:
        await t.set_limit("pool", 4)
        jobs = [asyncio.create_task(t.acquire([f"org:tenant-{i}", "pool"])) for i in range(60)]
        await eventually(lambda: t.acquired + t.waited + t.fail_open == len(jobs), 30)
        assert t.fail_open == 0
        assert t.acquired == 4
        assert len((await t.status("pool")).holders) == 4
        while jobs:  # every one is granted in its turn, through the same small pool
            done, _ = await asyncio.wait(jobs, return_when=asyncio.FIRST_COMPLETED)
            for job in done:
                jobs.remove(job)
                await t.release(job.result())
        assert t.fail_open == 0
        assert t.acquired == 60
    finally:
        await t.close()
        await client.aclose()
