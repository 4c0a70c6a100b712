"""An app whose handler kills its own process on the message ``poison`` (for the poison tests).

The lane comes from ``POISON_TOPIC``; handled values are added to the Redis set ``POISON_DONE``.
With ``POISON_NEIGHBOUR`` set (to ``slow``), the message ``slow`` takes ``SLOW_S`` to handle, and
the poison waits (at most ``SLOW_S`` plus a margin) until ``slow`` started as often as itself
before it kills the process: on its first start, the neighbour is surely running beside it.
"""

from __future__ import annotations

import asyncio
import os
import time

from redis.asyncio import Redis

from pipeline.runtime import App, Context
from pipeline.topics.spec import TopicSpec

spec = TopicSpec.model_validate(
    {"name": os.environ["POISON_TOPIC"], "partitions": 1, "retry": {"tiers": ["200ms"]}}
)
app = App([spec])
_redis = Redis.from_url(os.environ.get("PIPELINE_REDIS__URL", "redis://127.0.0.1:6379/0"))
DONE = os.environ["POISON_DONE"]
NEIGHBOUR = os.environ.get("POISON_NEIGHBOUR")
SLOW_S = 1.0


@app.handler(spec.lane)
async def handle(event: bytes, ctx: Context) -> None:
    """Record the value, or die on ``poison`` the way a segfault or OOM kill would."""
    if event == b"poison":
        if NEIGHBOUR:
            await _neighbour_running()
        os._exit(17)
    if event == b"slow":
        await _redis.incr(f"{DONE}:slow")
        await asyncio.sleep(SLOW_S)  # the workload: a slow downstream call
    await _redis.sadd(DONE, event)


async def _neighbour_running() -> None:
    starts = await _redis.incr(f"{DONE}:poison")
    deadline = time.monotonic() + SLOW_S + 2
    # The flag lives in Redis and is set by another task; poll it.
    while int(await _redis.get(f"{DONE}:slow") or 0) < starts and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
