"""A debounced lane's turn runner stops though its wake listener lost its cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pipeline.admission.debounce import Debouncer, Turn
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.admission.debounce.runner import TurnRunner
from pipeline.topics.spec import DebouncePolicy

pytestmark = pytest.mark.redis
PREFIX = "pltest"


@pytest.fixture
async def lane(redis: Redis, unique: str) -> AsyncIterator[str]:
    """A lane name no other test uses; its keys are deleted afterwards."""
    name = f"deblisten_{unique}"
    yield name
    async for key in redis.scan_iter(match=f"{debounce_keys.lane_tag(PREFIX, name)}*"):
        await redis.delete(key)


class AbsorbingWakes(Debouncer):
    """The real debouncer, whose blocking read of the wake list loses a first cancellation.

    The read is redis-py's ``BLPOP``, whose write goes through ``asyncio.wait_for``; on Python
    3.11 that returns instead of raising when the cancellation lands as the write completes
    (CPython issue 86296), and the listener reads on.
    """

    def __init__(self, redis: Redis, lane: str) -> None:
        """The lane's debouncer; its wake list not read yet."""
        policy = DebouncePolicy(key="conversation_id", quiet_s=0.05, max_wait_s=5.0, max_batch=10)
        super().__init__(redis, PREFIX, lane, policy)
        self.reading = asyncio.Event()
        self.absorbed = 0

    async def wait_wake(self, client: Redis, timeout_s: float) -> int | None:
        """Block on the wake list; a first cancellation is lost and the read starts again."""
        self.reading.set()
        while True:
            try:
                return await super().wait_wake(client, timeout_s)
            except asyncio.CancelledError:
                if self.absorbed:
                    raise
                self.absorbed += 1


async def no_turn(turn: Turn) -> bool:
    """No turn comes: nothing is recorded."""
    return True


async def test_a_stopped_runner_ends_though_its_wake_listener_lost_its_cancellation(
    redis: Redis, lane: str
) -> None:
    """The runner cancels its listener again until it ends; it used to wait for it for ever."""
    debouncer = AbsorbingWakes(redis, lane)
    runner = TurnRunner(debouncer, no_turn)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    await asyncio.wait_for(debouncer.reading.wait(), 10)
    stop.set()
    done, _ = await asyncio.wait({task}, timeout=10)  # the failure mode is a runner that hangs
    if not done:
        task.cancel()
        await asyncio.wait({task}, timeout=10)
    assert done, "the runner still waits for its wake listener"
    assert debouncer.absorbed == 1
