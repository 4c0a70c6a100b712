"""Property-based: random acquire/release/cancel sequences keep the throttle's invariants."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from pipeline.admission.throttle import Permit, Throttle

pytestmark = pytest.mark.redis

KEYS = ["job:1", "sub:a/1", "sub:a/2", "org:a", "org:b", "pool"]
LIMITS = {"job:1": 1, "sub:a/1": 1, "sub:a/2": 2, "org:a": 2, "org:b": 1, "pool": 3}

acquire_op = st.tuples(
    st.just("acquire"),
    st.integers(0, 1),
    st.sets(st.sampled_from(KEYS), min_size=1, max_size=3),
    st.integers(0, 3),
)
release_op = st.tuples(st.just("release"), st.integers(0, 50))
cancel_op = st.tuples(st.just("cancel"), st.integers(0, 50))
ops_strategy = st.lists(st.one_of(acquire_op, release_op, cancel_op), min_size=5, max_size=40)


async def _check(throttle: Throttle) -> None:
    for key, limit in LIMITS.items():
        status = await throttle.status(key)
        assert len(status.holders) <= limit, f"{key} over its limit"
        if status.waiters:
            assert len(status.holders) == limit, f"{key} has room while jobs wait"


class Scenario:
    """Two members on one namespace, driven by a list of operations."""

    def __init__(self, url: str, ns: str) -> None:
        """Prepare two members on the fresh namespace ``ns`` of the Redis at ``url``."""
        self.clients = [Redis.from_url(url) for _ in range(2)]
        self.members = [Throttle(c, namespace=ns, default_limit=1) for c in self.clients]
        self.tasks: list[asyncio.Task[Permit]] = []
        self.owner: dict[int, Throttle] = {}

    async def start(self) -> None:
        """Start the members and set the limits."""
        for m in self.members:
            await m.start()
        for key, limit in LIMITS.items():
            await self.members[0].set_limit(key, limit)

    async def acquire(self, m: int, keys: set[str], prio: int) -> None:
        """Start an acquisition on member ``m``; give it a moment to be granted or queued."""
        task = asyncio.create_task(self.members[m].acquire(sorted(keys), priority=prio))
        self.owner[id(task)] = self.members[m]
        self.tasks.append(task)
        await asyncio.wait([task], timeout=0.05)  # granted now, or queued in Redis

    async def release(self, task: asyncio.Task[Permit]) -> None:
        """Release the permit of ``task`` if it was granted."""
        if task.done() and not task.cancelled():
            self.tasks.remove(task)
            await self.owner[id(task)].release(task.result())

    async def cancel(self, task: asyncio.Task[Permit]) -> None:
        """Cancel ``task`` if it still waits, and let its withdrawal reach Redis."""
        if not task.done():
            self.tasks.remove(task)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            for m in self.members:
                await asyncio.gather(*m._background, return_exceptions=True)

    async def step(self, op: tuple[object, ...]) -> None:
        """Apply one operation, then check the invariants in Redis (atomic, so no waiting)."""
        if op[0] == "acquire":
            await self.acquire(op[1], op[2], op[3])  # type: ignore[arg-type]
        elif self.tasks:
            task = self.tasks[op[1] % len(self.tasks)]  # type: ignore[operator]
            await (self.release(task) if op[0] == "release" else self.cancel(task))
        await _check(self.members[0])

    async def drain(self) -> None:
        """Release everything as it is granted; every job must complete (no deadlock)."""
        while self.tasks:
            done, _ = await asyncio.wait(
                self.tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED
            )
            assert done, "a job never got its keys"
            for task in done:
                self.tasks.remove(task)
                await self.owner[id(task)].release(task.result())
        for key in KEYS:
            status = await self.members[0].status(key)
            assert status.holders == ()
            assert status.waiters == ()

    async def close(self) -> None:
        """Cancel what is left and close everything."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for m in self.members:
            await m.close()
        for c in self.clients:
            await c.aclose()


async def _scenario(url: str, ns: str, ops: list[tuple[object, ...]]) -> None:
    scenario = Scenario(url, ns)
    try:
        await scenario.start()
        for op in ops:
            await scenario.step(op)
        await scenario.drain()
    finally:
        await scenario.close()


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops_strategy)
def test_random_sequences_keep_invariants(redis_service, unique, ops):
    """No key exceeds its limit, no key has room while jobs wait, and every job completes.

    Each example has a namespace of its own, holding ``unique`` so the keys go with the test.
    """
    asyncio.run(_scenario(redis_service, f"h{unique}{uuid.uuid4().hex[:6]}", ops))
