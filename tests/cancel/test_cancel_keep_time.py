"""How long a cancellation stands: past its keep time it covers nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from pipeline.cancel import Target, cancel
from pipeline.cancel.functions import CancelFunctions, SyncBatch
from pipeline.cancel.target import Selectors, facts_of
from pipeline.envelope import Message

T0_MS = 1_700_000_000_000


@pytest.fixture
async def functions(redis: Redis, unique: str) -> AsyncIterator[CancelFunctions]:
    """The cancellation functions under a key prefix of the test's own, deleted after."""
    fns = CancelFunctions(redis, f"t{unique}")
    yield fns
    await redis.delete(*fns.keys.all())


async def test_a_cancellation_past_its_keep_time_covers_nothing(
    redis: Redis, functions: CancelFunctions
) -> None:
    """A key's cancellation stops covering its old messages once its keep time has passed."""
    await cancel(redis, functions.keys.prefix, Target("key", "K"), keep_ms=1_000, now_ms=T0_MS)
    selectors = Selectors(*await functions.selectors())
    old = facts_of(Message("lane", 0, 0, b"K", b"", {}, T0_MS - 10), "e1")
    assert selectors.reason("lane", old, T0_MS + 500) == "cancelled"
    assert selectors.reason("lane", old, T0_MS + 2_000) is None
    # The reconciler's re-check in Redis agrees: a registered run of the key, beating, goes on.
    record = {"lane": "lane", "member": "m", "key": "K", "origin": T0_MS - 10}
    run = "lane/m/1"
    await functions.sync(T0_MS + 2_000, SyncBatch(begun={run: json.dumps(record)}), [])
    assert await functions.settle(T0_MS + 2_000, 60_000, run) == "alive"
