"""An app whose handler waits until it is cancelled (for the second-signal test of consume).

The lane comes from ``SLEEPY_TOPIC``; each handler start pushes the value onto the Redis list
``SLEEPY_STARTED``.
"""

from __future__ import annotations

import asyncio
import os

from redis.asyncio import Redis

from pipeline.runtime import App, Context
from pipeline.topics.spec import TopicSpec

spec = TopicSpec.model_validate({"name": os.environ["SLEEPY_TOPIC"], "partitions": 1})
app = App([spec])
_redis = Redis.from_url(os.environ.get("PIPELINE_REDIS__URL", "redis://127.0.0.1:6379/0"))


@app.handler(spec.lane)
async def handle(event: bytes, ctx: Context) -> None:
    """Record the start, then wait for an hour (a cancellation ends it at once)."""
    await _redis.rpush(os.environ["SLEEPY_STARTED"], event)
    await asyncio.sleep(3600)
