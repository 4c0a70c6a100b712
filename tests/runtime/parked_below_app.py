"""An app for the parked-below tests: a key's second message fails, its retry copy hangs once.

The lane comes from ``BELOW_TOPIC`` (one partition, a 200 ms tier). Each run is pushed onto the
Redis list ``BELOW_RUNS`` as ``value:attempt:what``. ``m2`` fails on the main topic (its retry
copy parks the key); the first run of its copy, anywhere, sets ``BELOW_RUNS:hung`` and never
returns, so that a test can kill the member at that moment: ``m1`` ran, ``m2`` parked its key,
and nothing was committed yet (the test sets a long commit interval). Its copy's later runs wait
until the test sets ``BELOW_RUNS:go`` (the key stays parked meanwhile), then succeed; so does
every other run.
"""

from __future__ import annotations

import asyncio
import os

from redis.asyncio import Redis

from pipeline.errors import Retry
from pipeline.runtime import App, Context
from pipeline.topics.spec import TopicSpec

spec = TopicSpec.model_validate(
    {"name": os.environ["BELOW_TOPIC"], "partitions": 1, "retry": {"tiers": ["200ms"]}}
)
app = App([spec])
_redis = Redis.from_url(os.environ.get("PIPELINE_REDIS__URL", "redis://127.0.0.1:6379/0"))
RUNS = os.environ["BELOW_RUNS"]


@app.handler(spec.lane)
async def handle(event: bytes, ctx: Context) -> None:
    """Record the run; fail ``m2``'s first attempt; hang its copy's first run."""
    value = event.decode()
    if value == "m2" and ctx.attempt == 1:
        await _redis.rpush(RUNS, f"{value}:{ctx.attempt}:failed")
        raise Retry("the first attempt fails")
    if value == "m2" and await _redis.set(f"{RUNS}:hung", 1, nx=True):
        await _redis.rpush(RUNS, f"{value}:{ctx.attempt}:hung")
        await asyncio.Event().wait()  # until the test kills the process
    if value == "m2":
        # The flag is set by the test, in Redis; poll it.
        while not await _redis.exists(f"{RUNS}:go"):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    await _redis.rpush(RUNS, f"{value}:{ctx.attempt}:handled")
